//! The probe stream of one output partition: left batches gathered into probes of up to
//! `PROBE_ROWS` rows, each cut into slices whose pairs stay near `PAIRS_PER_PROBE` (a radius
//! join's slices grow as its probes learn how many pairs a row makes), two probes in flight, and
//! the output handed on in slices of the session's batch size.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result};
use datafusion::physical_plan::metrics::RecordOutput;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};

use super::probe::ProbeJob;
use super::LeftFromKept;
use super::{SharedBuild, PAIRS_PER_PROBE, PROBES_IN_FLIGHT, PROBE_ROWS};
use crate::join::CancelOnDrop;
use crate::planner::spec::JoinKind;
use datafusion::common::runtime::SpawnedTask;
use datafusion::physical_plan::metrics::Count;

/// What one output partition's stream is made of.
pub(super) struct StreamParts {
    pub probe: ProbeJob,
    pub build: SharedBuild,
    /// The left input's batches (after the read-ahead, when there is one).
    pub left_stream: BoxStream<'static, Result<RecordBatch>>,
    /// exclude_self=true on one input: the right side's own batches are probed instead.
    pub reuse_right: bool,
    pub exclude_self: bool,
    pub batch_size: usize,
    pub left_schema: SchemaRef,
    /// A left side the kept side gives (its rows all go to partition 0; the others have none),
    /// and the rows it gave.
    pub left_from_kept: Option<Arc<LeftFromKept>>,
    pub left_rows_from_index: Count,
    pub partition: usize,
    /// Stops the probes when the stream is dropped.
    pub on_drop: CancelOnDrop,
}

pub(super) fn probe_stream(parts: StreamParts) -> impl Stream<Item = Result<RecordBatch>> + Send {
    let StreamParts {
        probe,
        build,
        left_stream,
        reuse_right,
        exclude_self,
        batch_size,
        left_schema,
        left_from_kept,
        left_rows_from_index,
        partition,
        on_drop,
    } = parts;
    let baseline = probe.baseline.clone();
    let mut next_row: u64 = 0;
    let spec = Arc::clone(&probe.spec);
    let name = probe.spec.function_name();
    futures::stream::once(async move {
        let build = build.await.map_err(DataFusionError::Shared)?;
        let per_row = match spec.kind {
            JoinKind::Knn { k } => k.min(build.rows),
            JoinKind::Radius { .. } => build.rows,
        };
        // Left rows per probe, so that one probe's pairs stay near PAIRS_PER_PROBE. A radius
        // join starts from the worst case (every right row within the radius) and, as probes
        // find fewer pairs per row, grows the slice (at most 8x a probe): at 20 rows a probe
        // (100K right rows) the GPU had one block per left row and sat idle.
        let slice_rows = Arc::new(AtomicUsize::new((PAIRS_PER_PROBE / per_row.max(1)).max(1)));
        let grow_slices = matches!(spec.kind, JoinKind::Radius { .. });
        let slice_size = Arc::clone(&slice_rows);
        let left_stream: futures::stream::BoxStream<'static, Result<RecordBatch>> =
            match (&build.input, reuse_right) {
                (Some(input), true) => {
                    let slices: Vec<Result<RecordBatch>> = input
                        .iter()
                        .flat_map(|b| {
                            (0..b.num_rows())
                                .step_by(batch_size)
                                .map(|s| Ok(b.slice(s, batch_size.min(b.num_rows() - s))))
                        })
                        .collect();
                    futures::stream::iter(slices).boxed()
                }
                _ => match &left_from_kept {
                    // Every output partition sees the same kept side: all take the kept rows
                    // (partition 0 probes them) or all read their part of the left input.
                    Some(left) if build.side.vectors.is_some() => {
                        let batches = if partition == 0 {
                            let (side, left, schema) = (
                                Arc::clone(&build.side),
                                Arc::clone(left),
                                Arc::clone(&left_schema),
                            );
                            SpawnedTask::spawn_blocking(move || match &side.vectors {
                                Some(vectors) => super::kept_left::left_rows(
                                    &side.others,
                                    side.zones().as_deref(),
                                    vectors,
                                    &left,
                                    &schema,
                                    name,
                                ),
                                None => Ok(Vec::new()),
                            })
                            .await
                            .map_err(|e| DataFusionError::External(Box::new(e)))??
                        } else {
                            Vec::new()
                        };
                        left_rows_from_index
                            .add(batches.iter().map(RecordBatch::num_rows).sum::<usize>());
                        futures::stream::iter(batches.into_iter().map(Ok)).boxed()
                    }
                    _ => left_stream,
                },
            };
        // Left batches are gathered up to PROBE_ROWS rows (within the pairs a probe may
        // make): GPU launches over one session batch (8,192 rows) end on their few longest
        // rows with most of the device idle (movielens self join on an H200: 2.41 s of
        // kernels in 8,192-row probes, 1.97 s in 64K-row probes).
        // A radius join's slices grow as its probes find how many pairs a row makes, and
        // its gathers with them (a gather fixed at the first slice, a few rows, kept its
        // probes to one session batch).
        let gather_size = Arc::clone(&slice_rows);
        let left_schema = Arc::clone(&left_schema);
        let left_stream = futures::stream::unfold(Some(left_stream), move |input| {
            let left_schema = Arc::clone(&left_schema);
            let gather = PROBE_ROWS.min(gather_size.load(Ordering::Relaxed)).max(1);
            async move {
                let mut input = input?;
                let mut pending: Vec<RecordBatch> = Vec::new();
                let mut rows = 0;
                let more = loop {
                    match input.next().await {
                        Some(Ok(batch)) => {
                            rows += batch.num_rows();
                            pending.push(batch);
                            if rows >= gather {
                                break true;
                            }
                        }
                        Some(Err(e)) => return Some((Err(e), None)),
                        None if pending.is_empty() => return None,
                        None => break false,
                    }
                };
                let gathered = match pending.len() {
                    1 => Ok(pending.pop().expect("one batch")),
                    _ => concat_batches(&left_schema, &pending).map_err(Into::into),
                };
                Some((gathered, more.then_some(input)))
            }
        });
        let batches = left_stream
            .map_ok(move |batch| {
                let first_row = next_row;
                next_row += batch.num_rows() as u64;
                // Cut lazily: each slice takes the size the probes before it left.
                let slice_rows = Arc::clone(&slice_size);
                futures::stream::unfold(0usize, move |start| {
                    let batch = batch.clone();
                    let slice_rows = Arc::clone(&slice_rows);
                    async move {
                        (start < batch.num_rows()).then(|| {
                            let len = slice_rows
                                .load(Ordering::Relaxed)
                                .min(batch.num_rows() - start);
                            let slice = (first_row + start as u64, batch.slice(start, len));
                            (Ok::<_, DataFusionError>(slice), start + len)
                        })
                    }
                })
            })
            .try_flatten()
            .map_ok(move |(first_row, batch)| {
                let probe = probe.clone();
                let build = Arc::clone(&build);
                let slice_rows = Arc::clone(&slice_rows);
                async move {
                    let rows = batch.num_rows();
                    let out = probe.run(build, batch, first_row, exclude_self).await?;
                    if grow_slices {
                        let pairs: usize = out.iter().map(RecordBatch::num_rows).sum();
                        let per_row = pairs.div_ceil(rows.max(1)).max(1);
                        let fits = (PAIRS_PER_PROBE / (2 * per_row)).max(1);
                        // At most 8x the last slice: a few rows predict the next ones'
                        // pairs only roughly (2x took ten probes of a few GPU blocks each
                        // to reach a session batch).
                        slice_rows.store(fits.min(8 * rows.max(1)), Ordering::Relaxed);
                    }
                    Ok(out)
                }
            })
            // Two probes in flight: one's host work (converting its left rows, merging the
            // GPUs' lists, gathering the output columns) overlaps the other's kernels; the
            // output keeps the left order.
            .try_buffered(PROBES_IN_FLIGHT)
            // A left batch of n rows makes up to n * k pairs: hand them on in slices of the
            // session's batch size (slicing copies nothing).
            .map_ok(move |batches| {
                let slices = batches
                    .iter()
                    .flat_map(|batch| {
                        (0..batch.num_rows()).step_by(batch_size).map(|start| {
                            batch.slice(start, batch_size.min(batch.num_rows() - start))
                        })
                    })
                    .map(|slice| Ok(slice.record_output(&baseline)))
                    .collect::<Vec<_>>();
                futures::stream::iter(slices)
            })
            .try_flatten();
        Ok::<_, DataFusionError>(batches)
    })
    .try_flatten()
    .map(move |batch| {
        let _held_until_the_stream_is_dropped = &on_drop;
        batch
    })
}
