//! A right side held as several indexes over consecutive row ranges ("shards"): pieces small
//! enough for a backend's 32-bit offsets (a right side of more than 2^31 nonzeros), or one range
//! per GPU. A probe asks every shard for its own answer and merges them, so the result is the one
//! a single index over all rows would give, ties included (merges order ties by global row).

use std::sync::{Arc, OnceLock};

use arrow::array::{BooleanBufferBuilder, RecordBatch};
use arrow::buffer::BooleanBuffer;
use datafusion::common::{exec_datafusion_err, exec_err, Result};
use rayon::prelude::*;

use super::backend::{JoinIndex, Probed};
use super::cancel::Cancel;
use super::mask::RowMask;
use super::mask_program::MaskProgram;
use super::matrix::{MatrixOut, MatrixRows};
use super::merge::{merge_nearest, merge_within};
use super::pairs::PairList;
use super::selection::{ProbeOptions, Selection};
use super::within::GroupedProbe;
use crate::metric::Metric;
use crate::vector::SparseBatch;

/// The most stored entries one piece of the right side (or one left batch) holds: what 32-bit
/// list offsets can address. `SPARSE_KNN_MAX_CHUNK_NNZ` lowers it, so tests run the chunked path
/// on small data.
pub fn max_chunk_nnz() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var("SPARSE_KNN_MAX_CHUNK_NNZ")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .map_or(i32::MAX as usize, |n| n.min(i32::MAX as usize))
    })
}

/// Consecutive row ranges of `pieces` (in order), each of at most `target` nonzeros where rows
/// allow (a single row larger than `target` is a range of its own).
pub fn split_rows(pieces: Vec<SparseBatch>, target: usize) -> Result<Vec<SparseBatch>> {
    split_row_ranges(pieces, target)
        .iter()
        .map(|range| join_pieces(range))
        .collect()
}

/// One batch of consecutive pieces (the piece itself when there is one).
pub fn join_pieces(pieces: &[SparseBatch]) -> Result<SparseBatch> {
    match pieces {
        [one] => Ok(one.clone()),
        _ => SparseBatch::concat(pieces),
    }
}

/// [`split_rows`]'s ranges as the slices of `pieces` each is made of, not yet copied into one
/// batch (several GPUs' builds each copy their own at once).
pub fn split_row_ranges(pieces: Vec<SparseBatch>, target: usize) -> Vec<Vec<SparseBatch>> {
    let target = target.max(1);
    let mut chunks = Vec::new();
    let mut current: Vec<SparseBatch> = Vec::new();
    let mut current_nnz = 0usize;
    let flush = |current: &mut Vec<SparseBatch>, chunks: &mut Vec<Vec<SparseBatch>>| {
        if !current.is_empty() {
            chunks.push(std::mem::take(current));
        }
    };
    for piece in pieces {
        let mut start = 0;
        while start < piece.len() {
            // The most rows from `start` that still fit beside what `current` holds.
            let room = target.saturating_sub(current_nnz);
            let base = piece.offsets()[start] as u32 as usize;
            let mut end = start;
            while end < piece.len() && (piece.offsets()[end + 1] as u32 as usize) - base <= room {
                end += 1;
            }
            if end == start {
                if current.is_empty() {
                    // One row over the target: alone.
                    end = start + 1;
                } else {
                    flush(&mut current, &mut chunks);
                    current_nnz = 0;
                    continue;
                }
            }
            let taken = piece.slice(start, end - start);
            current_nnz += taken.nnz();
            current.push(taken);
            start = end;
            if current_nnz >= target {
                flush(&mut current, &mut chunks);
                current_nnz = 0;
            }
        }
    }
    flush(&mut current, &mut chunks);
    chunks
}

/// One row range of the right side and its index (shared: a kept side's segments are the shards
/// of every later side that grows from it).
pub struct Shard {
    pub first_row: usize,
    pub rows: usize,
    pub index: Arc<dyn JoinIndex>,
}

/// Several shards probed as one index.
pub struct ShardedIndex {
    shards: Vec<Shard>,
    similarity: bool,
    /// Probe the shards at once (they sit on different devices) or one after the other (each
    /// already uses every CPU core).
    parallel: bool,
}

impl ShardedIndex {
    /// `shards` must cover consecutive row ranges from row 0, in order; all rows below 2^32
    /// (pairs carry right rows as u32).
    pub fn new(shards: Vec<Shard>, similarity: bool, parallel: bool) -> Result<Self> {
        let mut next = 0usize;
        for s in &shards {
            if s.first_row != next {
                return exec_err!("shard at row {} after row {next}", s.first_row);
            }
            next += s.rows;
        }
        if next > u32::MAX as usize {
            return exec_err!(
                "the right side has {next} rows; at most {} are supported",
                u32::MAX
            );
        }
        Ok(Self {
            shards,
            similarity,
            parallel,
        })
    }

    fn probe_shard(
        shard: &Shard,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        mask: Option<&RowMask>,
        groups: Option<GroupedProbe<'_>>,
        cancel: &Cancel,
    ) -> Result<Probed> {
        let options = ProbeOptions {
            exclude_self_from: options
                .exclude_self_from
                .map(|first| first - shard.first_row as i64),
        };
        let mask = mask.map(|mask| mask.slice(shard.first_row, shard.rows));
        let mut probed = match (groups, &mask) {
            (Some(groups), mask) => {
                let groups = groups.shard(shard.first_row, shard.rows, mask.as_ref());
                shard
                    .index
                    .probe_grouped(left, groups, selection, options, cancel)?
            }
            (None, None) => shard
                .index
                .probe_cancellable(left, selection, options, cancel)?,
            (None, Some(mask)) => shard
                .index
                .probe_masked(left, selection, options, mask, cancel)?,
        };
        let offset = shard.first_row as u32;
        for part in &mut probed.parts {
            for r in part.right.iter_mut() {
                *r += offset;
            }
        }
        Ok(probed)
    }
}

impl ShardedIndex {
    fn probe_shards(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        mask: Option<&RowMask>,
        groups: Option<GroupedProbe<'_>>,
        cancel: &Cancel,
    ) -> Result<Probed> {
        let probe =
            |s: &Shard| Self::probe_shard(s, left, selection, options, mask, groups, cancel);
        let results: Vec<Result<Probed>> = if self.parallel && self.shards.len() > 1 {
            std::thread::scope(|scope| {
                let handles: Vec<_> = self
                    .shards
                    .iter()
                    .map(|s| scope.spawn(move || probe(s)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(exec_datafusion_err!("a shard's probe panicked"))
                        })
                    })
                    .collect()
            })
        } else {
            // One at a time, stopping at the first error.
            let mut out = Vec::with_capacity(self.shards.len());
            for s in &self.shards {
                let r = probe(s);
                let failed = r.is_err();
                out.push(r);
                if failed {
                    break;
                }
            }
            out
        };
        let mut probed = Probed::default();
        let mut parts = Vec::with_capacity(results.len());
        for r in results {
            parts.push(PairList::concat(probed.absorb(r?)));
        }
        let pairs = match selection {
            Selection::Nearest(k) => merge_nearest(parts, k, self.similarity),
            Selection::Within(_) => merge_within(parts),
        };
        probed.parts = vec![pairs];
        Ok(probed)
    }
}

impl JoinIndex for ShardedIndex {
    fn probe_cancellable(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
    ) -> Result<Probed> {
        self.probe_shards(left, selection, options, None, None, cancel)
    }

    /// Each shard probed with its rows of the mask, merged as unmasked probes are.
    fn probe_masked(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        mask: &RowMask,
        cancel: &Cancel,
    ) -> Result<Probed> {
        self.probe_shards(left, selection, options, Some(mask), None, cancel)
    }

    /// Each shard compares the groups of its own rows (on the GPU, in its kernels), merged as
    /// unmasked probes are: the k nearest of a left row's group are the nearest of each shard's.
    fn probe_grouped(
        &self,
        left: &SparseBatch,
        groups: GroupedProbe<'_>,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
    ) -> Result<Probed> {
        if groups.rows != self.shards.iter().map(|s| s.rows).sum::<usize>() {
            return exec_err!(
                "a grouped probe of {} rows for an index of {} rows",
                groups.rows,
                self.shards.iter().map(|s| s.rows).sum::<usize>()
            );
        }
        self.probe_shards(
            left,
            selection,
            options,
            groups.filter,
            Some(groups),
            cancel,
        )
    }

    /// Each shard's rows where it is kept (the GPUs side by side), joined in row order; None
    /// where any shard has no such place.
    fn mask_where_kept(
        &self,
        program: &MaskProgram,
        columns: &RecordBatch,
    ) -> Result<Option<BooleanBuffer>> {
        let rows: usize = self.shards.iter().map(|s| s.rows).sum();
        if columns.num_rows() != rows {
            return exec_err!(
                "a filter over {} rows for an index of {rows} rows",
                columns.num_rows()
            );
        }
        let masks: Vec<Result<Option<BooleanBuffer>>> = self
            .shards
            .par_iter()
            .map(|s| {
                s.index
                    .mask_where_kept(program, &columns.slice(s.first_row, s.rows))
            })
            .collect();
        let mut bits = BooleanBufferBuilder::new(rows);
        for mask in masks {
            match mask? {
                Some(shard) => bits.append_buffer(&shard),
                None => return Ok(None),
            }
        }
        Ok(Some(bits.finish()))
    }

    fn memory_size(&self) -> usize {
        self.shards.iter().map(|s| s.index.memory_size()).sum()
    }

    /// Each shard writes its own columns of the same rows, one shard after another (their
    /// columns interleave in every row, so they are not handed to threads as slices).
    fn distance_matrix(
        &self,
        metric: &Metric,
        left: MatrixRows<'_>,
        mut out: MatrixOut<'_>,
    ) -> Result<()> {
        let rows = left.rows();
        out.check(rows.len())?;
        for s in &self.shards {
            let part = out.columns(s.first_row, s.rows);
            s.index
                .distance_matrix(metric, MatrixRows::Given(rows), part)?;
        }
        Ok(())
    }

    fn build_bytes_to_device(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.index.build_bytes_to_device())
            .sum()
    }

    fn shards(&self) -> usize {
        self.shards.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(lens: &[usize]) -> SparseBatch {
        let rows: Vec<Vec<(i32, f32)>> = lens
            .iter()
            .map(|&n| (0..n as i32).map(|i| (i, 1.0 + i as f32)).collect())
            .collect();
        SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())))
    }

    #[test]
    fn split_rows_keeps_order_and_the_target() {
        let pieces = vec![batch(&[3, 3, 3]), batch(&[1]), batch(&[7, 2, 2])];
        let chunks = split_rows(pieces, 6).unwrap();
        let lens: Vec<Vec<usize>> = chunks
            .iter()
            .map(|c| (0..c.len()).map(|r| c.row(r).0.len()).collect())
            .collect();
        // The 7-entry row is over the target: alone.
        assert_eq!(lens, vec![vec![3, 3], vec![3, 1], vec![7], vec![2, 2]]);
        assert!(chunks.iter().all(|c| c.nnz() <= 6 || c.len() == 1));
        assert_eq!(split_rows(Vec::new(), 6).unwrap().len(), 0);
    }
}
