//! A kept right side over several files, held as segments (issue "Data that grows"): each segment
//! a run of consecutive files (in the right side's row order) with its own built side, the whole
//! side their `ShardedIndex`. A statement that finds new files builds a segment of those alone
//! and takes the others from the cache; a file rewritten or removed rebuilds the segment that held
//! it (the rest of its files). Segments keep their files' order and their rows' global numbers, so
//! a probe's merge over them is bit for bit a fresh build's answer, ties to the earlier row.
//!
//! Many small segments are merged beside the queries (`merge_groups`: adjacent segments of
//! similar size, a binary counter's carries, so that appending file after file keeps about log n
//! segments); the merged side replaces the entry only while it still describes the same files.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use arrow::compute::concat_batches;
use datafusion::common::{exec_err, Result};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool};
use datafusion::physical_plan::ExecutionPlan;

use super::identity::FileStamp;
use super::kept::{KeptSide, KeptVectors};
use crate::join::{JoinIndex, Shard, ShardedIndex};

/// The most segments a side keeps while merges of similar sizes find nothing to do (sizes so
/// uneven that no neighbours are within 2x of each other): past it, the smallest neighbours merge.
pub(crate) const MAX_SEGMENTS: usize = 24;

/// One segment: its files as they were when it was built (their stamps, and the files as a scan
/// reads them, to build them again in a merge), and its side.
#[derive(Clone)]
pub(crate) struct Segment {
    pub(crate) files: Vec<FileStamp>,
    pub(crate) scan_files: Vec<PartitionedFile>,
    pub(crate) side: Arc<KeptSide>,
}

/// The segments of a kept side, in row order, and what every version of that side shares: its
/// plan without its files and the index's shape (`shape`), and a plan of one version (`plan`),
/// whose file scan a merge points at the files it merges.
pub(crate) struct Segments {
    pub(crate) shape: String,
    pub(crate) plan: Arc<dyn ExecutionPlan>,
    pub(crate) list: Vec<Segment>,
}

impl Segments {
    /// The list with each of `merged` (the sides it replaces, and the merged segment) in place of
    /// those sides, where they still lie together in this list; None where none does.
    pub(crate) fn grafted(&self, merged: &[(Vec<Arc<KeptSide>>, Segment)]) -> Option<Vec<Segment>> {
        let mut list = self.list.clone();
        let mut any = false;
        for (replaced, segment) in merged {
            let at = (0..list.len()).find(|&i| {
                list.len() - i >= replaced.len()
                    && replaced
                        .iter()
                        .zip(&list[i..])
                        .all(|(r, s)| Arc::ptr_eq(r, &s.side))
            });
            if let Some(at) = at {
                list.splice(at..at + replaced.len(), [segment.clone()]);
                any = true;
            }
        }
        any.then_some(list)
    }
}

/// A piece of a side being made from a previous one: a kept segment, or files to build.
pub(crate) enum Part {
    Kept(Segment),
    Build(Range<usize>),
}

/// A run of a side's files against segments of an earlier version: a segment kept as it is (its
/// position among those offered, and the files it covers), or files to build.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Run {
    Kept(usize, Range<usize>),
    Build(Range<usize>),
}

impl Run {
    pub(crate) fn files(&self) -> Range<usize> {
        match self {
            Run::Kept(_, files) | Run::Build(files) => files.clone(),
        }
    }
}

/// `files` (in row order) in runs against `segments` (each over the files `files_of` gives):
/// every segment whose files appear unchanged and in a row where they fall is kept (the longest
/// that fits, a merged segment rather than the ones it merged; then the first offered); the files
/// between are runs to build. A segment with a file rewritten, removed or split by a new file is
/// not kept (its current files are among the runs).
pub(crate) fn runs_against<S>(
    segments: &[S],
    files_of: impl Fn(&S) -> &[FileStamp],
    files: &[FileStamp],
) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut pending: Option<usize> = None;
    let mut at = 0;
    while at < files.len() {
        let kept = segments
            .iter()
            .enumerate()
            .map(|(i, s)| (i, files_of(s)))
            .filter(|(_, kept)| !kept.is_empty() && files[at..].starts_with(kept))
            .max_by_key(|(i, kept)| (kept.len(), std::cmp::Reverse(*i)));
        match kept {
            Some((i, kept)) => {
                if let Some(start) = pending.take() {
                    runs.push(Run::Build(start..at));
                }
                runs.push(Run::Kept(i, at..at + kept.len()));
                at += kept.len();
            }
            None => {
                pending.get_or_insert(at);
                at += 1;
            }
        }
    }
    if let Some(start) = pending {
        runs.push(Run::Build(start..files.len()));
    }
    runs
}

/// The right side over `files` (in row order) from the segments of `previous` (the held versions
/// of the side, most recently used first): [`runs_against`] every segment they hold.
pub(crate) fn reuse(previous: &[Arc<Segments>], files: &[FileStamp]) -> Vec<Part> {
    let held: Vec<&Segment> = previous.iter().flat_map(|p| p.list.iter()).collect();
    runs_against(&held, |s| &s.files, files)
        .into_iter()
        .map(|run| match run {
            Run::Kept(i, _) => Part::Kept(held[i].clone()),
            Run::Build(files) => Part::Build(files),
        })
        .collect()
}

/// Runs of adjacent segments (by their rows) to merge, each of two or more: neighbours of sizes
/// within 2x of each other merge (again and again, so appended files carry like a binary
/// counter's bits: about log2 n segments, each row rebuilt about log2 n times), then, past
/// [`MAX_SEGMENTS`], the neighbours smallest together.
pub(crate) fn merge_groups(rows: &[usize]) -> Vec<Range<usize>> {
    // Each entry: the original segments it covers and its rows.
    let mut merged: Vec<(Range<usize>, usize)> = rows
        .iter()
        .enumerate()
        .map(|(i, &r)| (i..i + 1, r))
        .collect();
    let similar = |a: usize, b: usize| a.max(1) < 2 * b.max(1) && b.max(1) < 2 * a.max(1);
    loop {
        // The similar neighbours nearest the end (the newest, smallest files) merge first.
        let pair = (1..merged.len())
            .rev()
            .find(|&i| similar(merged[i - 1].1, merged[i].1))
            .or_else(|| {
                (merged.len() > MAX_SEGMENTS)
                    .then(|| (1..merged.len()).min_by_key(|&i| merged[i - 1].1 + merged[i].1))
                    .flatten()
            });
        let Some(i) = pair else { break };
        let (right, right_rows) = merged.remove(i);
        let left = &mut merged[i - 1];
        left.0 = left.0.start..right.end;
        left.1 += right_rows;
    }
    merged
        .into_iter()
        .filter(|(range, _)| range.len() > 1)
        .map(|(range, _)| range)
        .collect()
}

/// One side of several segments' sides, in order: their indexes as the shards of one
/// `ShardedIndex` (probed one after the other: each uses every core, or its GPUs), their other
/// columns in one batch (reserved in `pool`), their kept inputs and vectors end to end.
pub(crate) fn joined(
    parts: &[Arc<KeptSide>],
    similarity: bool,
    pool: &Arc<dyn MemoryPool>,
    name: &str,
) -> Result<KeptSide> {
    let Some(first) = parts.first() else {
        return exec_err!("{name}: a right side of no segments");
    };
    if parts.iter().any(|p| p.key_groups.is_some()) {
        return exec_err!("{name}: a right side with exclude_self=COLUMN is not held in segments");
    }
    let mut shards = Vec::with_capacity(parts.len());
    let mut first_row = 0;
    for part in parts {
        shards.push(Shard {
            first_row,
            rows: part.rows,
            index: Arc::clone(&part.index) as Arc<dyn JoinIndex>,
        });
        first_row += part.rows;
    }
    let index = ShardedIndex::new(shards, similarity, false)?;
    let others = concat_batches(
        &first.others.schema(),
        parts.iter().map(|p| &p.others).collect::<Vec<_>>(),
    )?;
    let input = parts
        .iter()
        .map(|p| p.input.clone())
        .collect::<Option<Vec<_>>>()
        .map(|inputs| inputs.into_iter().flatten().collect());
    let vectors = parts
        .iter()
        .map(|p| p.vectors.as_ref().map(KeptVectors::arrays))
        .collect::<Option<Vec<_>>>()
        .map(|arrays| KeptVectors::new(arrays.into_iter().flatten().cloned().collect()));
    let own = others.get_array_memory_size();
    let reservation = MemoryConsumer::new(format!("{name}[segmented build side]")).register(pool);
    reservation.try_grow(own)?;
    Ok(KeptSide {
        index: Arc::new(index),
        rows: first_row,
        input,
        key_groups: None,
        others,
        vectors,
        host_bytes: own + parts.iter().map(|p| p.host_bytes).sum::<usize>(),
        device_bytes: parts.iter().map(|p| p.device_bytes).sum(),
        _reservation: Arc::new(reservation),
        within_groups: Default::default(),
        segments: parts.to_vec(),
        zones: Default::default(),
    })
}

/// The shapes whose merges run now: one merge at a time for a side.
#[derive(Default)]
pub(crate) struct Merging {
    shapes: Mutex<Vec<String>>,
}

/// A merge in flight; dropped when it ends (done, failed or given up).
pub(crate) struct MergeGuard {
    merging: Arc<Merging>,
    shape: String,
}

impl Merging {
    /// The right to merge `shape`'s segments, unless a merge of them runs.
    pub(crate) fn begin(self: &Arc<Self>, shape: &str) -> Option<MergeGuard> {
        let mut shapes = self.shapes.lock().unwrap_or_else(|e| e.into_inner());
        if shapes.iter().any(|s| s == shape) {
            return None;
        }
        shapes.push(shape.to_string());
        Some(MergeGuard {
            merging: Arc::clone(self),
            shape: shape.to_string(),
        })
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.shapes.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for MergeGuard {
    fn drop(&mut self) {
        let mut shapes = self
            .merging
            .shapes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        shapes.retain(|s| s != &self.shape);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(name: &str, size: u64) -> FileStamp {
        FileStamp::for_test(name, size)
    }

    fn describe(parts: &[Part]) -> Vec<String> {
        parts
            .iter()
            .map(|p| match p {
                Part::Kept(s) => format!("kept {}", s.files.len()),
                Part::Build(r) => format!("build {r:?}"),
            })
            .collect()
    }

    fn segments(groups: &[&[(&str, u64)]]) -> Segments {
        let side = Arc::new(KeptSide::empty_for_test());
        Segments {
            shape: String::new(),
            plan: Arc::new(datafusion::physical_plan::empty::EmptyExec::new(Arc::new(
                arrow::datatypes::Schema::empty(),
            ))),
            list: groups
                .iter()
                .map(|files| Segment {
                    files: files.iter().map(|&(n, s)| stamp(n, s)).collect(),
                    scan_files: Vec::new(),
                    side: Arc::clone(&side),
                })
                .collect(),
        }
    }

    #[test]
    fn new_files_are_built_and_unchanged_segments_kept() {
        let previous = [Arc::new(segments(&[&[("a", 1), ("b", 1)], &[("c", 1)]]))];
        let now = [stamp("a", 1), stamp("b", 1), stamp("c", 1), stamp("d", 1)];
        assert_eq!(
            describe(&reuse(&previous, &now)),
            ["kept 2", "kept 1", "build 3..4"]
        );
        // A file between them (a name that sorts there) and a rewritten one.
        let now = [stamp("a", 1), stamp("b", 2), stamp("bb", 1), stamp("c", 1)];
        assert_eq!(describe(&reuse(&previous, &now)), ["build 0..3", "kept 1"]);
        // A removed file rebuilds the rest of its segment only.
        let now = [stamp("b", 1), stamp("c", 1)];
        assert_eq!(describe(&reuse(&previous, &now)), ["build 0..1", "kept 1"]);
        assert_eq!(describe(&reuse(&[], &now)), ["build 0..2"]);
    }

    #[test]
    fn appended_segments_merge_like_a_binary_counter() {
        // One large segment, then files of 10 rows one by one: the tail stays logarithmic.
        let mut rows = vec![1000];
        let mut most = 0;
        for _ in 0..64 {
            rows.push(10);
            for group in merge_groups(&rows).into_iter().rev() {
                let sum = rows[group.clone()].iter().sum();
                rows.splice(group, [sum]);
            }
            most = most.max(rows.len());
        }
        assert_eq!(rows.iter().sum::<usize>(), 1000 + 640);
        assert!(most <= 8, "{most} segments: {rows:?}");
        // Sizes far apart stay apart.
        assert!(merge_groups(&[1000, 100, 10]).is_empty());
        assert_eq!(merge_groups(&[1000, 10, 10]), vec![1..3]);
        // Too many uneven segments: the smallest neighbours merge.
        let uneven: Vec<usize> = (0..MAX_SEGMENTS + 3).map(|i| 1 << (40 - i)).collect();
        let groups = merge_groups(&uneven);
        let left = uneven.len() - groups.iter().map(|g| g.len() - 1).sum::<usize>();
        assert!(left <= MAX_SEGMENTS, "{left} left: {groups:?}");
    }
}
