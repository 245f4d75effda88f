//! A kept right side: what a join built (or took from an index file or a `SparseIndex`) and
//! what later statements probe while the index cache holds it — the index, the right rows'
//! other columns for the output, the key groups, and the memory it holds.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::execution::memory_pool::MemoryReservation;

use crate::join::{JoinIndex, KeyGroups};

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
}
