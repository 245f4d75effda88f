//! Stopping a probe whose query is gone (its output stream dropped: a `LIMIT` satisfied, Ctrl-C
//! in the shell, a failed sibling): the backends look at the token between units of work (a few
//! left rows on the CPU, one kernel launch on the GPU) and give up with an error nobody reads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use datafusion::common::{exec_datafusion_err, Result};

#[derive(Debug, Default)]
struct State {
    cancelled: AtomicBool,
    /// Left rows probed so far under this token (what a test looks at to see the work stop).
    rows_probed: AtomicU64,
}

/// Shared by the operator (which cancels) and the probes it started (which check).
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<State>);

impl Cancel {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::Relaxed)
    }

    /// An error once cancelled.
    pub fn check(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(exec_datafusion_err!("the query was cancelled"))
        } else {
            Ok(())
        }
    }

    pub fn add_rows(&self, rows: usize) {
        self.0.rows_probed.fetch_add(rows as u64, Ordering::Relaxed);
    }

    pub fn rows_probed(&self) -> u64 {
        self.0.rows_probed.load(Ordering::Relaxed)
    }
}

/// Cancels its token when dropped: held by an operator's output stream.
#[derive(Debug)]
pub struct CancelOnDrop(pub Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}
