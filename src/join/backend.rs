//! The one interface between the planner's operators and a backend.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::buffer::BooleanBuffer;
use datafusion::common::Result;

use super::cancel::Cancel;
use super::mask::{probe_masked_by_growing, RowMask};
use super::mask_program::MaskProgram;
use super::matrix::{matrix_by_probe, MatrixOut, MatrixRows};
use super::pairs::PairList;
use super::selection::{ProbeOptions, Selection};
use super::sharded::{max_chunk_nnz, split_rows, Shard, ShardedIndex};
use super::within::{probe_within_groups, GroupedProbe};
use crate::metric::Metric;
use crate::vector::SparseBatch;

/// What one probe returned, with the counters EXPLAIN ANALYZE shows.
#[derive(Debug, Default)]
pub struct Probed {
    /// The pairs in consecutive lists, each of whole left rows, in left row order: a CPU probe
    /// hands on its workers' lists as they are (a radius join's pairs run to hundreds of MB, which
    /// one list would write a second time), and the operator makes a record batch of each.
    pub parts: Vec<PairList>,
    /// Time spent computing (kernel time on a GPU, wall time of the probe on the CPU).
    pub compute_time: Duration,
    /// Bytes copied to a device for this probe (0 on the CPU).
    pub bytes_to_device: u64,
    /// Kernel time on each GPU (by CUDA ordinal) that worked on this probe.
    pub gpu_times: Vec<(usize, Duration)>,
}

impl Probed {
    /// Adds `other`'s counters to these (kernel time summed per GPU) and returns its pairs,
    /// which the caller places: appended, or merged with other parts of the right side.
    pub fn absorb(&mut self, other: Probed) -> Vec<PairList> {
        self.compute_time += other.compute_time;
        self.bytes_to_device += other.bytes_to_device;
        for (ordinal, t) in other.gpu_times {
            match self.gpu_times.iter_mut().find(|(o, _)| *o == ordinal) {
                Some((_, total)) => *total += t,
                None => self.gpu_times.push((ordinal, t)),
            }
        }
        other.parts
    }

    /// The pairs as one list.
    pub fn into_pairs(self) -> PairList {
        PairList::concat(self.parts)
    }
}

/// The right side of a join, built once by a backend and probed by every left batch, possibly
/// from several threads at once.
pub trait JoinIndex: Send + Sync {
    /// The pairs of `left` against the whole right side.
    fn probe(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
    ) -> Result<Probed> {
        self.probe_cancellable(left, selection, options, &Cancel::new())
    }

    /// [`JoinIndex::probe`], giving up with an error soon after `cancel` is set.
    fn probe_cancellable(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
    ) -> Result<Probed>;

    /// [`JoinIndex::probe_cancellable`] offering only the right rows `mask` passes (a filtered
    /// right side over a kept index): the k nearest among them, or those within the radius,
    /// exactly as an index of those rows alone would answer (right rows keep their numbers).
    /// By default a probe for more rows, the failing ones dropped ([`probe_masked_by_growing`]);
    /// a backend that skips them inside its probe overrides this.
    fn probe_masked(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        mask: &RowMask,
        cancel: &Cancel,
    ) -> Result<Probed> {
        probe_masked_by_growing(self, left, selection, options, mask, cancel)
    }

    /// `within=COLUMN`: the pairs of `left` with the right rows of each left row's own group
    /// (and the filter's, where there is one), exactly as a masked probe per group would give
    /// them. By default one masked probe per group ([`probe_within_groups`]); a backend that
    /// compares the groups inside its probe (the GPU's folded kernels) overrides this.
    fn probe_grouped(
        &self,
        left: &SparseBatch,
        groups: GroupedProbe<'_>,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
    ) -> Result<Probed> {
        probe_within_groups(self, left, groups, selection, options, cancel)
    }

    /// The rows of `columns` (the side's other columns, a row for each row indexed) that
    /// `program` passes, computed where the index lives (a GPU's kernel over the columns it
    /// keeps there); None where the index has no such place, or the columns no room there: the
    /// host's cores then evaluate the predicate, as they do any other.
    fn mask_where_kept(
        &self,
        _program: &MaskProgram,
        _columns: &RecordBatch,
    ) -> Result<Option<BooleanBuffer>> {
        Ok(None)
    }

    /// Host memory held by the index while it lives, including per-thread probe workspace.
    fn memory_size(&self) -> usize;

    /// Bytes the build copied to a device (0 on the CPU).
    fn build_bytes_to_device(&self) -> u64 {
        0
    }

    /// Row ranges of the right side indexed separately (see [`ShardedIndex`]).
    fn shards(&self) -> usize {
        1
    }

    /// Every distance between the rows of `left` and the right rows, written into `out` (see
    /// [`MatrixOut`]; for `dot`, a similarity, the dot product), NaN where either row is NULL.
    /// `metric` is the one the index was built for. A backend that computes the block directly
    /// overrides this; by default it is a probe within an infinite radius, its pairs placed.
    fn distance_matrix(
        &self,
        metric: &Metric,
        left: MatrixRows<'_>,
        out: MatrixOut<'_>,
    ) -> Result<()> {
        matrix_by_probe(self, metric, left.rows(), out)
    }

    /// The `k` nearest of each of `rows`, the rows this index was built from (the caller
    /// vouches; lengths are checked), among themselves, its own pair left out: row r's in
    /// `distances[r * k..]` and `indices[r * k..]`, nearest first, ties to the earlier row;
    /// slots not filled (a NULL row, fewer than k other rows) are left as they are. `Ok(false)`,
    /// nothing written, where the backend has no such shortcut that gives the probe's answer
    /// bit for bit: probe instead (the default).
    fn self_nearest(
        &self,
        _metric: &Metric,
        _rows: &SparseBatch,
        _k: usize,
        _out: (&mut [f64], &mut [i64]),
    ) -> Result<bool> {
        Ok(false)
    }
}

/// A place joins run (the CPU cores, the GPUs): builds the right side's index.
pub trait Backend: Send + Sync {
    /// A short name for EXPLAIN and logs ("cpu", "gpu").
    fn name(&self) -> &'static str;

    /// The index of `right` for `metric`; errors say what went wrong (no device, no memory).
    fn build(&self, right: &SparseBatch, metric: &Metric) -> Result<Box<dyn JoinIndex>>;

    /// The index of a right side of any size, given as consecutive pieces (its batches, each
    /// with 32-bit offsets): one index when it fits one batch, else a [`ShardedIndex`] over
    /// pieces of at most [`max_chunk_nnz`] entries each.
    fn build_pieces(
        &self,
        pieces: Vec<SparseBatch>,
        metric: &Metric,
    ) -> Result<Box<dyn JoinIndex>> {
        let chunks = split_rows(pieces, max_chunk_nnz())?;
        let similarity = metric.kind.is_similarity();
        build_shards(chunks, similarity, false, |_, chunk| {
            self.build(chunk, metric)
        })
    }
}

/// One index per chunk (`build(position, chunk)`), as a [`ShardedIndex`] when there are several;
/// an empty right side is one empty chunk.
pub fn build_shards(
    mut chunks: Vec<SparseBatch>,
    similarity: bool,
    parallel: bool,
    mut build: impl FnMut(usize, &SparseBatch) -> Result<Box<dyn JoinIndex>>,
) -> Result<Box<dyn JoinIndex>> {
    if chunks.is_empty() {
        chunks.push(SparseBatch::concat(&[])?);
    }
    let indexes = chunks
        .iter()
        .enumerate()
        .map(|(i, chunk)| Ok((chunk.len(), build(i, chunk)?)))
        .collect::<Result<Vec<_>>>()?;
    join_shards(indexes, similarity, parallel)
}

/// The indexes of consecutive row ranges (rows, index), as one index: itself when there is one.
pub fn join_shards(
    mut indexes: Vec<(usize, Box<dyn JoinIndex>)>,
    similarity: bool,
    parallel: bool,
) -> Result<Box<dyn JoinIndex>> {
    if indexes.len() == 1 {
        return Ok(indexes.pop().expect("one index").1);
    }
    let mut shards = Vec::with_capacity(indexes.len());
    let mut first_row = 0;
    for (rows, index) in indexes {
        shards.push(Shard {
            first_row,
            rows,
            index: Arc::from(index),
        });
        first_row += rows;
    }
    Ok(Box::new(ShardedIndex::new(shards, similarity, parallel)?))
}
