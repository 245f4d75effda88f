//! A k above the kernels' top-k ([`MAX_DEVICE_K`]): every pair's distance computed on the device
//! and the k nearest selected on the host.

use datafusion::common::Result;

use super::super::device::Lanes;
use super::super::stats::GpuStats;
use crate::join::{Cancel, PairList, ProbeOptions, Selection, TopK};
use crate::vector::SparseBatch;

use super::*;

impl GpuIndex {
    /// k above what the kernels select: every pair's distance is computed on the device (the
    /// radius kernels with an unbounded radius, in chunks the budget holds) and the k nearest of
    /// each left row are kept on the host, ties to the earlier right row as everywhere.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn probe_large_k(
        &self,
        inner: &Inner,
        lanes: &Lanes<'_>,
        left: &SparseBatch,
        k: usize,
        options: ProbeOptions,
        cancel: &Cancel,
        stats: &mut GpuStats,
    ) -> Result<PairList> {
        let everything = if self.program.similarity {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
        let mut out = PairList::default();
        let mut topk = TopK::default();
        let rows_per_step = self.rows_per_step_of_every_pair();
        let mut r0 = 0;
        while r0 < left.len() {
            let r1 = (r0 + rows_per_step).min(left.len());
            let all = self.probe_locked(
                inner,
                lanes,
                &left.slice(r0, r1 - r0),
                Selection::Within(everything),
                options.shifted(r0),
                cancel,
                stats,
                Bounds::NONE,
            )?;
            let mut i = 0;
            while i < all.len() {
                let lrow = all.left[i];
                topk.reset(k);
                // Pairs come ordered by right row, so an equal distance keeps the earlier row.
                while i < all.len() && all.left[i] == lrow {
                    let d = all.distance[i];
                    topk.push(if self.program.similarity { -d } else { d }, all.right[i]);
                    i += 1;
                }
                for (key, j) in topk.drain_sorted() {
                    let d = if self.program.similarity { -key } else { key };
                    out.push(r0 as u32 + lrow, j, d);
                }
            }
            r0 = r1;
        }
        Ok(out)
    }
}
