//! The index cache: built right sides kept after their statement, for later joins whose right
//! side has the same identity (`identity.rs`). One cache per session (a session-config
//! extension that [`crate::register_all`] installs), or one per process for a cluster executor,
//! whose tasks and queries then share it.
//!
//! What a cached side holds stays counted where it was reserved: its host memory in the memory
//! pool of the session that built it, its device memory on its GPUs (a later build reads the
//! device's free memory for its budget, which leaves out what cached indexes hold). The cache
//! is bounded by `sparse_knn.index_cache` (a quarter of the memory pool by default, 2 GiB
//! when the pool is unbounded; 0 turns it off), and evicts the least recently used side first.
//! A side in use by a running statement lives until that statement ends, evicted or not.
//!
//! The default bound fits the machine: host bytes within a quarter of a finite memory pool, or
//! half the physical memory when the pool is unbounded; GPU-resident sides' device bytes within
//! the devices' memory that a side's build found (a side's build fails or streams when the
//! device is full; the cache never holds more than the devices have). A bound that is set
//! (`SET sparse_knn.index_cache = '8GiB'`) counts host and device bytes together.
//!
//! Statements that ask for a side while another builds it wait for that build instead of
//! building their own (the tasks of one query on a cluster executor start together): a right
//! side is built once per cache.

use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use datafusion::execution::memory_pool::MemoryLimit;
use datafusion::execution::TaskContext;
use futures::channel::oneshot;
use futures::future::{FutureExt, Shared};

use super::identity::IndexKey;
use super::kept::KeptSide;
use super::segments::{MergeGuard, Merging, Segments};

/// The default host bound when physical memory cannot be read and the pool is unbounded.
const UNBOUNDED_POOL_DEFAULT: usize = 2 << 30;

/// What the cache may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    /// `sparse_knn.index_cache` set: host and device bytes together.
    Set(usize),
    /// The default: host bytes and device bytes each within their own bound.
    Machine { host: usize, device: usize },
}

impl Bound {
    fn fits(&self, host: usize, device: usize) -> bool {
        match *self {
            Bound::Set(bytes) => host.saturating_add(device) <= bytes,
            Bound::Machine {
                host: host_bound,
                device: device_bound,
            } => host <= host_bound && device <= device_bound,
        }
    }

    fn describe(&self) -> String {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        match *self {
            Bound::Set(bytes) => format!("sparse_knn.index_cache ({:.1} MiB)", mib(bytes)),
            Bound::Machine { host, device } => format!(
                "the default bound ({:.1} MiB of host memory, {:.1} MiB of device memory)",
                mib(host),
                mib(device)
            ),
        }
    }
}

/// Built right sides kept across statements (see the module's documentation).
#[derive(Default)]
pub struct IndexCache {
    state: Mutex<State>,
    merging: Arc<Merging>,
}

impl std::fmt::Debug for IndexCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("IndexCache")
            .field("entries", &state.entries.len())
            .field("bytes", &state.bytes())
            .finish()
    }
}

/// Resolves when a build in flight is over: with its side, or None when it failed or was
/// dropped (the waiter then builds its own).
type InFlight = Shared<oneshot::Receiver<Option<Arc<KeptSide>>>>;

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    clock: u64,
    building: Vec<(IndexKey, InFlight)>,
    hits: u64,
    builds: u64,
}

/// What a lookup found.
pub(crate) enum Lookup {
    Hit(Arc<KeptSide>),
    /// Another statement builds this side: wait for it.
    Wait(InFlight),
    /// Build it, then [`Claim::finish`].
    Build(Claim),
}

/// The right to build a side that others may wait for; dropped unfinished, it lets them build.
pub(crate) struct Claim {
    cache: Arc<IndexCache>,
    key: IndexKey,
    done: Option<oneshot::Sender<Option<Arc<KeptSide>>>>,
}

impl Claim {
    /// Keeps `side` (within `bound`) and hands it to those waiting.
    pub(crate) fn finish(self, side: &Arc<KeptSide>, pinned: Vec<RecordBatch>, bound: Bound) {
        self.finish_with(side, pinned, None, bound)
    }

    /// [`Claim::finish`] for a side held in `segments`: it replaces the older versions of the
    /// same side (their files changed since; their segments live on in this one).
    pub(crate) fn finish_segmented(
        self,
        side: &Arc<KeptSide>,
        segments: Arc<Segments>,
        bound: Bound,
    ) {
        self.finish_with(side, Vec::new(), Some(segments), bound)
    }

    fn finish_with(
        mut self,
        side: &Arc<KeptSide>,
        pinned: Vec<RecordBatch>,
        segments: Option<Arc<Segments>>,
        bound: Bound,
    ) {
        self.cache
            .insert(self.key.clone(), Arc::clone(side), pinned, segments, bound);
        if let Some(done) = self.done.take() {
            let _ = done.send(Some(Arc::clone(side)));
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut state = self.cache.lock();
        state.building.retain(|(k, _)| k != &self.key);
        if let Some(done) = self.done.take() {
            let _ = done.send(None);
        }
    }
}

impl State {
    fn bytes(&self) -> usize {
        self.host_bytes() + self.device_bytes()
    }

    fn host_bytes(&self) -> usize {
        self.entries.iter().map(|e| e.side.host_bytes).sum()
    }

    fn device_bytes(&self) -> usize {
        self.entries.iter().map(|e| e.side.device_bytes).sum()
    }

    /// Evicts the least recently used sides until the rest and `extra` more bytes (host,
    /// device) fit `bound`.
    fn evict_to(&mut self, bound: Bound, (host, device): (usize, usize)) {
        while !bound.fits(self.host_bytes() + host, self.device_bytes() + device) {
            let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used)
            else {
                return;
            };
            let evicted = self.entries.swap_remove(oldest);
            log::debug!(
                "index cache: evicted a right side of {} host and {} device bytes",
                evicted.side.host_bytes,
                evicted.side.device_bytes
            );
        }
    }
}

struct Entry {
    key: IndexKey,
    side: Arc<KeptSide>,
    /// Where the side is held in segments: them, and what its versions share.
    segments: Option<Arc<Segments>>,
    last_used: u64,
    /// The in-memory batches the key names by address.
    _pinned: Vec<RecordBatch>,
}

impl IndexCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Right sides held now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Host and device bytes the held sides take.
    pub fn bytes(&self) -> usize {
        self.lock().bytes()
    }

    /// Drops every held side (those in use live until their statements end).
    pub fn clear(&self) {
        self.lock().entries.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Right sides taken from the cache (or from a build another statement ran while this one
    /// waited), and right sides built for it, since the cache was made.
    pub fn hits(&self) -> u64 {
        self.lock().hits
    }

    pub fn builds(&self) -> u64 {
        self.lock().builds
    }

    /// The side under `key`, a build of it to wait for, or the claim to build it.
    pub(crate) fn lookup(self: &Arc<Self>, key: &IndexKey) -> Lookup {
        let mut state = self.lock();
        state.clock += 1;
        let now = state.clock;
        if let Some(entry) = state.entries.iter_mut().find(|e| &e.key == key) {
            entry.last_used = now;
            let side = Arc::clone(&entry.side);
            state.hits += 1;
            return Lookup::Hit(side);
        }
        if let Some((_, in_flight)) = state.building.iter().find(|(k, _)| k == key) {
            return Lookup::Wait(in_flight.clone());
        }
        let (done, in_flight) = oneshot::channel();
        state.building.push((key.clone(), in_flight.shared()));
        state.builds += 1;
        Lookup::Build(Claim {
            cache: Arc::clone(self),
            key: key.clone(),
            done: Some(done),
        })
    }

    /// The segment lists of the held sides of `shape` (the plan without its files, and the
    /// index's shape), most recently used first: the segments a new version may take.
    pub(crate) fn segments_for(&self, shape: &str) -> Vec<Arc<Segments>> {
        let state = self.lock();
        let mut held: Vec<(u64, Arc<Segments>)> = state
            .entries
            .iter()
            .filter_map(|e| Some((e.last_used, e.segments.clone()?)))
            .filter(|(_, s)| s.shape == shape)
            .collect();
        held.sort_by_key(|(used, _)| std::cmp::Reverse(*used));
        held.into_iter().map(|(_, s)| s).collect()
    }

    /// The segments of the most recently used held side of `shape` (see `segments_for`).
    pub(crate) fn newest_segments(&self, shape: &str) -> Option<Arc<Segments>> {
        self.segments_for(shape).into_iter().next()
    }

    /// Puts a merged `side` in place of the one held in `before`, while the cache still holds
    /// that one (a newer version or an eviction since makes the merge moot): false when not.
    pub(crate) fn replace_merged(
        &self,
        before: &Arc<Segments>,
        side: Arc<KeptSide>,
        segments: Arc<Segments>,
    ) -> bool {
        let mut state = self.lock();
        let Some(entry) = state
            .entries
            .iter_mut()
            .find(|e| e.segments.as_ref().is_some_and(|s| Arc::ptr_eq(s, before)))
        else {
            return false;
        };
        entry.side = side;
        entry.segments = Some(segments);
        true
    }

    /// The right to merge the segments of `shape`'s side, unless a merge of them runs.
    pub(crate) fn begin_merge(&self, shape: &str) -> Option<MergeGuard> {
        self.merging.begin(shape)
    }

    /// Merges of segments running now (in the background, beside the statements).
    pub fn merges_in_flight(&self) -> usize {
        self.merging.in_flight()
    }

    /// Counts a side taken from a build that this statement waited for.
    pub(crate) fn count_hit(&self) {
        self.lock().hits += 1;
    }

    /// Keeps `side` under `key` within `bound`, evicting the least recently used; a side
    /// larger than the whole bound is not kept.
    fn insert(
        &self,
        key: IndexKey,
        side: Arc<KeptSide>,
        pinned: Vec<RecordBatch>,
        segments: Option<Arc<Segments>>,
        bound: Bound,
    ) {
        let mut state = self.lock();
        // An older version of the side (a segment of it lives on in this one) goes: its files
        // changed, and it would count the shared segments twice.
        state.entries.retain(|e| {
            let older_version = match (&e.segments, &segments) {
                (Some(held), Some(new)) => held
                    .list
                    .iter()
                    .any(|old| new.list.iter().any(|s| Arc::ptr_eq(&s.side, &old.side))),
                _ => false,
            };
            e.key != key && !older_version
        });
        let (host, device) = (side.host_bytes, side.device_bytes);
        if !bound.fits(host, device) {
            // Said once a side: a later statement over the same data builds it again, and the
            // user may not know why.
            log::warn!(
                "index cache: a right side of {:.1} MiB ({:.1} MiB of it on devices) is larger \
                 than {} and is not kept; SET sparse_knn.index_cache = '{}MiB' (or more) to \
                 reuse it in later statements",
                (host + device) as f64 / (1 << 20) as f64,
                device as f64 / (1 << 20) as f64,
                bound.describe(),
                (host + device).div_ceil(1 << 20)
            );
            return;
        }
        state.evict_to(bound, (host, device));
        state.clock += 1;
        let last_used = state.clock;
        state.entries.push(Entry {
            key,
            side,
            segments,
            last_used,
            _pinned: pinned,
        });
    }

    /// Evicts until the held sides fit `bound` (after the setting shrank).
    pub(crate) fn shrink_to(&self, bound: Bound) {
        self.lock().evict_to(bound, (0, 0));
    }
}

/// The cache a task's joins use and its bound (`setting`: the join's `index_cache`, None for
/// the default); None when the session has no cache or the bound is 0.
pub(crate) fn task_cache(
    context: &TaskContext,
    setting: Option<u64>,
) -> Option<(Arc<IndexCache>, Bound)> {
    let cache = context.session_config().get_extension::<IndexCache>()?;
    let bound = match setting {
        Some(0) => {
            cache.clear();
            return None;
        }
        Some(bytes) => Bound::Set(usize::try_from(bytes).unwrap_or(usize::MAX)),
        None => Bound::Machine {
            host: match context.memory_pool().memory_limit() {
                MemoryLimit::Finite(pool) => pool / 4,
                MemoryLimit::Infinite | MemoryLimit::Unknown => {
                    physical_memory().map_or(UNBOUNDED_POOL_DEFAULT, |bytes| bytes / 2)
                }
            },
            // A GPU side's build found room for it on its devices (their free memory is its
            // budget); what the cache keeps there is bounded by the devices themselves.
            device: usize::MAX,
        },
    };
    cache.shrink_to(bound);
    Some((cache, bound))
}

/// The machine's physical memory, where the system says.
fn physical_memory() -> Option<usize> {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && page > 0).then(|| (pages as usize).saturating_mul(page as usize))
}
