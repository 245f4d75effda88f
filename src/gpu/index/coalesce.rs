//! Lookups that arrive together are probed together. A server's clients (`sparse-knn serve`)
//! each send one-row lookups against the same kept index; a launch of one left row keeps a lane
//! of the device for the whole probe while the kernels have little to do, so lookups queue
//! behind each other. Here a probe of a few left rows that finds every lane of the device taken
//! waits with the others that arrive meanwhile, and the first of them to find a lane free probes
//! all their rows in one launch; each gets its own rows' pairs back. A probe that finds a lane
//! free runs at once: a lone lookup never waits, and a wait lasts no longer than the probe ahead
//! of it (no timer to tune: the busier the device, the larger the launches).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use datafusion::common::{exec_datafusion_err, Result};

use super::GpuIndex;
use crate::gpu::stats::GpuStats;
use crate::join::{Cancel, PairList, ProbeOptions, Selection};
use crate::vector::SparseBatch;

/// Left rows of a probe that may wait to be launched with others (a lookup's few rows; a batch
/// join's batches are launches of their own).
pub(crate) const MOST_ROWS_TO_COALESCE: usize = 64;

/// Left rows of one launch of lookups together.
const MOST_ROWS_TOGETHER: usize = 4096;

/// How often a waiting probe looks at its statement's cancellation.
const CANCEL_POLL: Duration = Duration::from_millis(5);

type Answer = Result<(PairList, GpuStats)>;

/// The probes of one index waiting for a lane, and the answers not yet taken.
#[derive(Default)]
pub(super) struct Coalescer {
    state: Mutex<Queue>,
    changed: Condvar,
}

#[derive(Default)]
struct Queue {
    /// Probes of this index running now (at most the device's lanes go through here).
    running: usize,
    waiting: Vec<Waiting>,
    answered: Vec<(u64, Answer)>,
    next_ticket: u64,
    /// Launches that carried more than one probe, and the probes they carried (for tests and
    /// the log).
    launches_together: u64,
    probes_together: u64,
}

struct Waiting {
    ticket: u64,
    left: SparseBatch,
    selection: Selection,
}

impl Coalescer {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Launches that carried several probes, and how many probes they carried in all.
    pub(super) fn together(&self) -> (u64, u64) {
        let queue = self.queue();
        (queue.launches_together, queue.probes_together)
    }
}

/// Counts a running probe out when it ends, panicking or not, and wakes the waiting ones.
struct Running<'a>(&'a Coalescer);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.queue().running -= 1;
        self.0.changed.notify_all();
    }
}

impl GpuIndex {
    /// Whether a probe may wait to be launched with others: a few left rows, a selection the
    /// kernels finish (no host step), no row of its own to exclude, and not on a rayon worker
    /// (one that waited here could be the worker a launch's own parallel steps wait for).
    pub(super) fn coalesces(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
    ) -> bool {
        rayon::current_thread_index().is_none()
            && !left.is_empty()
            && left.len() <= MOST_ROWS_TO_COALESCE
            && options.exclude_self_from.is_none()
            && self.masks_on_device(selection)
    }

    /// [`GpuIndex::probe_counted`] of a probe that [`GpuIndex::coalesces`]: at once where a lane
    /// is free, else launched with the probes that wait beside it.
    pub(super) fn probe_coalesced(
        &self,
        left: &SparseBatch,
        selection: Selection,
        cancel: &Cancel,
    ) -> Answer {
        let lanes = match self.inner.resident {
            Some(_) => self.device.lane_count().max(1),
            // Streamed parts take every lane: one probe at a time.
            None => 1,
        };
        let coalescer = &self.coalescer;
        let mut queue = coalescer.queue();
        if queue.running < lanes && queue.waiting.is_empty() {
            queue.running += 1;
            drop(queue);
            let _running = Running(coalescer);
            return self.probe_counted_masked(
                left,
                selection,
                ProbeOptions::default(),
                cancel,
                None,
                None,
            );
        }
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        queue.waiting.push(Waiting {
            ticket,
            left: left.clone(),
            selection,
        });
        loop {
            if let Some(at) = queue.answered.iter().position(|(t, _)| *t == ticket) {
                return queue.answered.swap_remove(at).1;
            }
            // Still waiting (not taken into another's launch, whose answer will come).
            if let Some(at) = queue.waiting.iter().position(|w| w.ticket == ticket) {
                if cancel.is_cancelled() {
                    queue.waiting.remove(at);
                    return Err(exec_datafusion_err!("the query was cancelled"));
                }
                if queue.running < lanes {
                    let together = take_together(&mut queue.waiting, at);
                    queue.running += 1;
                    if together.len() > 1 {
                        queue.launches_together += 1;
                        queue.probes_together += together.len() as u64;
                    }
                    drop(queue);
                    if together.len() > 1 {
                        log::debug!(
                            "GPU {}: {} lookups launched together",
                            self.ordinal(),
                            together.len()
                        );
                    }
                    let running = Running(coalescer);
                    let answers = catch_unwind(AssertUnwindSafe(|| self.probe_together(&together)))
                        .unwrap_or_else(|_| {
                            together
                                .iter()
                                .map(|_| Err(exec_datafusion_err!("GPU: a probe panicked")))
                                .collect()
                        });
                    let mut mine = None;
                    {
                        let mut queue = coalescer.queue();
                        for (w, answer) in together.iter().zip(answers) {
                            if w.ticket == ticket {
                                mine = Some(answer);
                            } else {
                                queue.answered.push((w.ticket, answer));
                            }
                        }
                    }
                    drop(running);
                    return mine.unwrap_or_else(|| {
                        Err(exec_datafusion_err!("GPU: a launch lost its own probe"))
                    });
                }
            }
            queue = coalescer
                .changed
                .wait_timeout(queue, CANCEL_POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// One launch of the waiting probes' rows; each probe's pairs (its own rows numbered from 0)
    /// and its share of the launch's counters, in `together`'s order.
    fn probe_together(&self, together: &[Waiting]) -> Vec<Answer> {
        let selection = together[0].selection;
        let batches: Vec<SparseBatch> = together.iter().map(|w| w.left.clone()).collect();
        // Nobody's cancellation ends the others' launch: a few rows, soon done.
        let launched = SparseBatch::concat(&batches).and_then(|all| {
            self.probe_counted_masked(
                &all,
                selection,
                ProbeOptions::default(),
                &Cancel::new(),
                None,
                None,
            )
        });
        match launched {
            Ok((pairs, stats)) => split_answers(&batches, pairs, &stats)
                .into_iter()
                .map(Ok)
                .collect(),
            Err(e) => {
                let message = e.to_string();
                together
                    .iter()
                    .map(|_| Err(exec_datafusion_err!("{message}")))
                    .collect()
            }
        }
    }
}

/// The waiting probe at `at` and those waiting with the same selection, in arrival order, up
/// to [`MOST_ROWS_TOGETHER`] rows; taken out of `waiting`.
fn take_together(waiting: &mut Vec<Waiting>, at: usize) -> Vec<Waiting> {
    let selection = waiting[at].selection;
    let mut rows = waiting[at].left.len();
    let mut chosen = vec![false; waiting.len()];
    chosen[at] = true;
    for (i, w) in waiting.iter().enumerate() {
        if i != at && w.selection == selection && rows + w.left.len() <= MOST_ROWS_TOGETHER {
            rows += w.left.len();
            chosen[i] = true;
        }
    }
    let mut together = Vec::new();
    let mut rest = Vec::new();
    for (w, take) in std::mem::take(waiting).into_iter().zip(chosen) {
        if take {
            together.push(w);
        } else {
            rest.push(w);
        }
    }
    *waiting = rest;
    together
}

/// Each batch's pairs out of the pairs of their rows probed as one batch (`batches` end to end),
/// in the order they came, with the launch's counters shared by rows.
fn split_answers(
    batches: &[SparseBatch],
    pairs: PairList,
    stats: &GpuStats,
) -> Vec<(PairList, GpuStats)> {
    let mut starts = Vec::with_capacity(batches.len());
    let mut total = 0usize;
    for b in batches {
        starts.push(total);
        total += b.len();
    }
    let mut answers: Vec<(PairList, GpuStats)> = batches
        .iter()
        .map(|b| {
            let share = |x: u64| (x as u128 * b.len() as u128 / total.max(1) as u128) as u64;
            (
                PairList::default(),
                GpuStats {
                    bytes_to_device: share(stats.bytes_to_device),
                    kernel_nanos: share(stats.kernel_nanos),
                    peak_device_bytes: stats.peak_device_bytes,
                    most_tile_groups: stats.most_tile_groups,
                },
            )
        })
        .collect();
    for i in 0..pairs.len() {
        let row = pairs.left[i] as usize;
        let owner = starts.partition_point(|&s| s <= row) - 1;
        answers[owner].0.push(
            (row - starts[owner]) as u32,
            pairs.right[i],
            pairs.distance[i],
        );
    }
    answers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(rows: &[&[(i32, f32)]]) -> SparseBatch {
        SparseBatch::from_rows(rows.iter().map(|r| Some(*r)))
    }

    #[test]
    fn each_batch_gets_its_own_rows_pairs_numbered_from_zero_and_a_share_of_the_counters() {
        let row: &[(i32, f32)] = &[(0, 1.0)];
        let batches = vec![batch(&[row]), batch(&[row, row, row]), batch(&[row, row])];
        let mut pairs = PairList::default();
        // Rows 0 | 1 2 3 | 4 5, two pairs a row, as a launch gives them (left row, then rank).
        for left in 0..6u32 {
            pairs.push(left, 10 + left, left as f64);
            pairs.push(left, 20 + left, left as f64 + 0.5);
        }
        let stats = GpuStats {
            bytes_to_device: 600,
            kernel_nanos: 6_000,
            peak_device_bytes: 7,
            most_tile_groups: 3,
        };
        let answers = split_answers(&batches, pairs, &stats);
        assert_eq!(answers.len(), 3);
        assert_eq!(answers[0].0.left, vec![0, 0]);
        assert_eq!(answers[0].0.right, vec![10, 20]);
        assert_eq!(answers[1].0.left, vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(answers[1].0.right, vec![11, 21, 12, 22, 13, 23]);
        assert_eq!(answers[1].0.distance, vec![1.0, 1.5, 2.0, 2.5, 3.0, 3.5]);
        assert_eq!(answers[2].0.left, vec![0, 0, 1, 1]);
        assert_eq!(answers[2].0.right, vec![14, 24, 15, 25]);
        assert_eq!(answers[1].1.kernel_nanos, 3_000);
        assert_eq!(answers[2].1.bytes_to_device, 200);
        assert_eq!(answers[0].1.peak_device_bytes, 7);
    }

    #[test]
    fn a_launch_takes_the_probes_of_the_same_selection_up_to_its_rows() {
        let one: &[(i32, f32)] = &[(1, 2.0)];
        let wait = |ticket: u64, rows: usize, selection: Selection| Waiting {
            ticket,
            left: batch(&vec![one; rows]),
            selection,
        };
        let mut waiting = vec![
            wait(0, 1, Selection::Nearest(10)),
            wait(1, 2, Selection::Nearest(5)),
            wait(2, 3, Selection::Nearest(10)),
            wait(3, MOST_ROWS_TOGETHER, Selection::Nearest(10)),
            wait(4, 1, Selection::Nearest(10)),
        ];
        let together = take_together(&mut waiting, 2);
        let taken: Vec<u64> = together.iter().map(|w| w.ticket).collect();
        // Its own first in arrival order, the other k = 10 probes that fit; not k = 5, not the
        // one too large to fit beside them.
        assert_eq!(taken, vec![0, 2, 4]);
        let left: Vec<u64> = waiting.iter().map(|w| w.ticket).collect();
        assert_eq!(left, vec![1, 3]);
    }
}
