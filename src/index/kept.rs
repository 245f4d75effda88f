//! A kept right side: what a join built (or took from an index file or a `SparseIndex`) and
//! what later statements probe while the index cache holds it — the index, the right rows'
//! other columns for the output, the key groups, and the memory it holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use datafusion::common::Result;
use datafusion::execution::memory_pool::MemoryReservation;

use super::Zones;
use crate::join::{GroupMembers, JoinIndex, KeyGroups};

/// The right side, ready to probe.
pub(crate) struct KeptSide {
    pub(crate) index: Arc<dyn JoinIndex>,
    pub(crate) rows: usize,
    /// The right input itself, when the operator probes it against itself (exclude_self=true):
    /// its batches as read (not concatenated: their list offsets may not fit one batch).
    pub(crate) input: Option<Vec<RecordBatch>>,
    /// `exclude_self=COLUMN`: the right rows' key groups.
    pub(crate) key_groups: Option<KeyGroups>,
    /// The right input's other columns, all rows in order.
    pub(crate) others: RecordBatch,
    /// The right input's vector column as read (its own Arrow type, untouched), so that a left
    /// side that filters the same source takes its rows from here rather than scanning the source
    /// again (see `planner::exec::kept_left`). None where the side keeps no other column (no
    /// predicate could pick its rows) or the pool had no room for them.
    pub(crate) vectors: Option<KeptVectors>,
    /// Host bytes held (reserved in the pool): what a cached side counts against the cache's
    /// host bound.
    pub(crate) host_bytes: usize,
    /// Bytes copied to devices (GPU-resident sides), counted against the devices' memory.
    pub(crate) device_bytes: usize,
    pub(crate) _reservation: Arc<MemoryReservation>,
    /// `within=COLUMN`'s groups, by column of `others`: made by the first statement that asks,
    /// kept with the side (a new grouping costs a pass over one column, not a build).
    pub(crate) within_groups: Mutex<HashMap<usize, Arc<GroupMembers>>>,
    /// A side held in segments (`segments.rs`): the segments' own sides, whose indexes are this
    /// side's shards (held here with the memory they reserved). Empty for a side built whole.
    pub(crate) segments: Vec<Arc<KeptSide>>,
    /// Zone maps of `others`, made by the first statement that filters the side (`zones`).
    pub(crate) zones: OnceLock<Option<Arc<Zones>>>,
}

impl KeptSide {
    /// A side of no rows and no columns, for tests of what holds sides.
    #[cfg(test)]
    pub(crate) fn empty_for_test() -> Self {
        let pool: Arc<dyn datafusion::execution::memory_pool::MemoryPool> =
            Arc::new(datafusion::execution::memory_pool::UnboundedMemoryPool::default());
        let index = crate::join::Backend::build(
            &crate::cpu::CpuBackend,
            &crate::vector::SparseBatch::from_rows(std::iter::empty()),
            &crate::metric::Metric::new("cosine", None, None).expect("cosine"),
        )
        .expect("an empty index");
        KeptSide {
            index: Arc::from(index),
            rows: 0,
            input: None,
            key_groups: None,
            others: RecordBatch::new_empty(Arc::new(arrow::datatypes::Schema::empty())),
            vectors: None,
            host_bytes: 0,
            device_bytes: 0,
            _reservation: Arc::new(
                datafusion::execution::memory_pool::MemoryConsumer::new("test").register(&pool),
            ),
            within_groups: Default::default(),
            segments: Vec::new(),
            zones: OnceLock::new(),
        }
    }

    /// The zone maps of `others` (see `index::zones`), made once a side; None where they could
    /// not be made (a predicate is then evaluated over every row).
    pub(crate) fn zones(&self) -> Option<Arc<Zones>> {
        self.zones
            .get_or_init(|| {
                Zones::of(&self.others)
                    .and_then(|zones| {
                        // Held as long as the side, in the session's pool with it (a few KB a
                        // column per million rows).
                        self._reservation.try_grow(zones.memory_size())?;
                        Ok(Arc::new(zones))
                    })
                    .inspect_err(|e| log::debug!("no zone maps of the kept columns: {e}"))
                    .ok()
            })
            .clone()
    }

    /// The groups of column `column` of `others` (see `within_groups`).
    pub(crate) fn groups_of(&self, column: usize) -> Result<Arc<GroupMembers>> {
        let mut held = self.within_groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(groups) = held.get(&column) {
            return Ok(Arc::clone(groups));
        }
        let groups = Arc::new(GroupMembers::build(self.others.column(column))?);
        // Held as long as the side: in the session's pool with it.
        self._reservation
            .try_grow(groups.memory_size())
            .map_err(|e| {
                datafusion::common::DataFusionError::ResourcesExhausted(format!(
                    "within={}: the right side's groups need {} bytes of session memory: {e}",
                    self.others.schema().field(column).name(),
                    groups.memory_size()
                ))
            })?;
        held.insert(column, Arc::clone(&groups));
        Ok(groups)
    }
}

/// A kept side's vector column: the arrays of the batches it was read in (one array could not
/// hold more than 2^31 entries), and the first row of each.
pub(crate) struct KeptVectors {
    arrays: Vec<ArrayRef>,
    starts: Vec<usize>,
}

impl KeptVectors {
    pub(crate) fn new(arrays: Vec<ArrayRef>) -> Self {
        let mut starts = Vec::with_capacity(arrays.len());
        let mut row = 0;
        for array in &arrays {
            starts.push(row);
            row += array.len();
        }
        Self { arrays, starts }
    }

    /// The arrays as read, one a batch.
    pub(crate) fn arrays(&self) -> &[ArrayRef] {
        &self.arrays
    }

    pub(crate) fn memory_size(&self) -> usize {
        self.arrays.iter().map(|a| a.get_array_memory_size()).sum()
    }

    /// The vectors of `rows` (increasing), as arrays of at most one read batch's rows each:
    /// `(first of rows in this piece, piece)`.
    pub(crate) fn take(&self, rows: &[u32]) -> Result<Vec<(usize, ArrayRef)>> {
        let mut pieces = Vec::new();
        let mut at = 0;
        while at < rows.len() {
            let row = rows[at] as usize;
            let batch = self.starts.partition_point(|&s| s <= row) - 1;
            let (start, len) = (self.starts[batch], self.arrays[batch].len());
            let end = at + rows[at..].partition_point(|&r| (r as usize) < start + len);
            let local =
                UInt32Array::from_iter_values(rows[at..end].iter().map(|&r| r - start as u32));
            pieces.push((
                at,
                arrow::compute::take(self.arrays[batch].as_ref(), &local, None)?,
            ));
            at = end;
        }
        Ok(pieces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, Int32Array};
    use std::sync::Arc;

    #[test]
    fn take_spans_the_read_batches_in_row_order() {
        let arrays: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(vec![10, 11, 12])),
            Arc::new(Int32Array::from(Vec::<i32>::new())),
            Arc::new(Int32Array::from(vec![13, 14])),
            Arc::new(Int32Array::from(vec![15])),
        ];
        let kept = KeptVectors::new(arrays);
        let pieces = kept.take(&[0, 2, 3, 5]).unwrap();
        let got: Vec<(usize, Vec<i32>)> = pieces
            .iter()
            .map(|(first, a)| {
                let a = a.as_any().downcast_ref::<Int32Array>().unwrap();
                (*first, a.values().to_vec())
            })
            .collect();
        assert_eq!(got, vec![(0, vec![10, 12]), (2, vec![13]), (3, vec![15])]);
        assert!(kept.take(&[]).unwrap().is_empty());
    }
}
