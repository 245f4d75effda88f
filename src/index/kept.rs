//! A kept right side: what a join built (or took from an index file or a `SparseIndex`) and
//! what later statements probe while the index cache holds it — the index, the right rows'
//! other columns for the output, the key groups, and the memory it holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use datafusion::common::Result;
use datafusion::execution::memory_pool::MemoryReservation;

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
    /// Host bytes held (reserved in the pool): what a cached side counts against the cache's
    /// host bound.
    pub(crate) host_bytes: usize,
    /// Bytes copied to devices (GPU-resident sides), counted against the devices' memory.
    pub(crate) device_bytes: usize,
    pub(crate) _reservation: Arc<MemoryReservation>,
    /// `within=COLUMN`'s groups, by column of `others`: made by the first statement that asks,
    /// kept with the side (a new grouping costs a pass over one column, not a build).
    pub(crate) within_groups: Mutex<HashMap<usize, Arc<GroupMembers>>>,
}

impl KeptSide {
    /// The groups of column `column` of `others` (see `within_groups`).
    pub(crate) fn groups_of(&self, column: usize) -> Result<Arc<GroupMembers>> {
        let mut held = self.within_groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(groups) = held.get(&column) {
            return Ok(Arc::clone(groups));
        }
        let groups = Arc::new(GroupMembers::build(self.others.column(column))?);
        held.insert(column, Arc::clone(&groups));
        Ok(groups)
    }
}
