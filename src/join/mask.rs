//! A right-side filter as a row mask: `knn_join(q, (SELECT * FROM docs WHERE ...), ...)` probes
//! the index of `docs` (built once, kept) and offers only the rows the predicate passes, instead
//! of building an index of the filtered rows for every predicate.
//!
//! The k nearest among the rows that pass are the first k passing rows in the whole side's
//! (distance, row) order, so any index answers a masked probe exactly: by default
//! ([`probe_masked_by_growing`]) it probes for more than k and drops the rows that fail, asking
//! again with a larger k for the left rows that kept fewer than k; a backend that can skip the
//! failing rows inside its probe (the CPU: `Keep`'s valid flags) overrides
//! [`JoinIndex::probe_masked`](super::JoinIndex::probe_masked).

use std::sync::Arc;

use datafusion::common::Result;
use rayon::prelude::*;

use super::backend::{JoinIndex, Probed};
use super::cancel::Cancel;
use super::pairs::PairList;
use super::selection::{ProbeOptions, Selection};
use crate::vector::SparseBatch;

/// Which right rows pass a filter: a view of consecutive rows of one mask (a shard of the right
/// side sees its own rows).
#[derive(Debug, Clone)]
pub struct RowMask {
    rows: Arc<[bool]>,
    first: usize,
    len: usize,
    passing: usize,
}

impl RowMask {
    /// The mask of `pass` (one flag a right row, in row order).
    pub fn new(pass: Vec<bool>) -> Self {
        let passing = pass.par_iter().filter(|&&p| p).count();
        let len = pass.len();
        RowMask {
            rows: pass.into(),
            first: 0,
            len,
            passing,
        }
    }

    /// The mask of `len` rows that passes `rows` alone (sorted, distinct, each below `len`).
    pub fn from_rows(len: usize, rows: &[u32]) -> Self {
        let mut pass = vec![false; len];
        for &r in rows {
            pass[r as usize] = true;
        }
        RowMask {
            rows: pass.into(),
            first: 0,
            len,
            passing: rows.len(),
        }
    }

    /// Right rows the mask covers.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rows that pass.
    pub fn passing(&self) -> usize {
        self.passing
    }

    /// Whether every row passes (a probe then needs no mask).
    pub fn all_pass(&self) -> bool {
        self.passing == self.len
    }

    /// The flags, one a row of the view.
    pub fn as_slice(&self) -> &[bool] {
        &self.rows[self.first..self.first + self.len]
    }

    /// Whether right row `row` (of the view) passes.
    pub fn allows(&self, row: usize) -> bool {
        self.rows[self.first + row]
    }

    /// Rows `first..first + len` of the view, as a mask of their own (a shard's rows).
    pub fn slice(&self, first: usize, len: usize) -> RowMask {
        let start = self.first + first;
        let passing = self.rows[start..start + len].iter().filter(|&&p| p).count();
        RowMask {
            rows: Arc::clone(&self.rows),
            first: start,
            len,
            passing,
        }
    }
}

/// Bytes a mask holds.
impl RowMask {
    pub fn memory_size(&self) -> usize {
        self.rows.len()
    }
}

/// A masked probe by any index, exact: within a radius, the probe's pairs less the rows that
/// fail; for the k nearest, a probe for about k / (share that passes) rows, then again with four
/// times as many for the left rows that kept fewer than k, until each has k or has seen every
/// row. Pairs come in left row order, then rank.
pub fn probe_masked_by_growing<I: JoinIndex + ?Sized>(
    index: &I,
    left: &SparseBatch,
    selection: Selection,
    options: ProbeOptions,
    mask: &RowMask,
    cancel: &Cancel,
) -> Result<Probed> {
    if mask.all_pass() {
        return index.probe_cancellable(left, selection, options, cancel);
    }
    let k = match selection {
        Selection::Within(_) => {
            let mut probed = index.probe_cancellable(left, selection, options, cancel)?;
            for part in &mut probed.parts {
                *part = kept(part, mask);
            }
            return Ok(probed);
        }
        Selection::Nearest(k) => k,
    };
    let n = mask.len();
    let mut probed = Probed::default();
    if mask.passing() == 0 || k == 0 {
        probed.parts.push(PairList::default());
        return Ok(probed);
    }
    // Expected rows to ask for, with room for an uneven spread of the passing rows.
    let expected = k.saturating_mul(n).div_ceil(mask.passing());
    let mut ask = expected
        .saturating_add(expected / 4)
        .saturating_add(16)
        .min(n);
    let mut answers: Vec<Vec<(u32, f64)>> = vec![Vec::new(); left.len()];
    let mut pending: Vec<usize> = (0..left.len()).filter(|&r| !left.is_null(r)).collect();
    let mut first_round = true;
    while !pending.is_empty() {
        // The first round probes the batch as it is; later ones gather the rows still short, whose
        // own rows (exclude_self) are then left out here rather than by the probe.
        let (batch, probe_options, asked) = if first_round {
            (left.clone(), options, ask)
        } else {
            let rows = left.gather(&pending);
            let extra = usize::from(options.exclude_self_from.is_some());
            (rows, ProbeOptions::default(), (ask + extra).min(n))
        };
        let parts = probed.absorb(index.probe_cancellable(
            &batch,
            Selection::Nearest(asked),
            probe_options,
            cancel,
        )?);
        let pairs = PairList::concat(parts);
        let mut found: Vec<Vec<(u32, f64)>> = vec![Vec::new(); pending.len()];
        for i in 0..pairs.len() {
            let at = pairs.left[i] as usize;
            let row = if first_round { at } else { pending[at] };
            let slot = if first_round {
                pending.binary_search(&row).ok()
            } else {
                Some(at)
            };
            if let Some(slot) = slot {
                found[slot].push((pairs.right[i], pairs.distance[i]));
            }
        }
        let mut still = Vec::new();
        for (slot, row) in pending.iter().copied().enumerate() {
            let seen = found[slot].len();
            let own = if first_round {
                None
            } else {
                options.excluded_right_row(row, n)
            };
            let passing: Vec<(u32, f64)> = found[slot]
                .iter()
                .copied()
                .filter(|&(r, _)| mask.allows(r as usize) && own != Some(r as usize))
                .take(k)
                .collect();
            if passing.len() >= k || seen < asked || asked >= n {
                answers[row] = passing;
            } else {
                still.push(row);
            }
        }
        pending = still;
        first_round = false;
        ask = ask.saturating_mul(4).min(n);
    }
    let mut pairs = PairList::with_capacity(answers.iter().map(Vec::len).sum());
    for (row, answer) in answers.into_iter().enumerate() {
        for (right, distance) in answer {
            pairs.push(row as u32, right, distance);
        }
    }
    probed.parts = vec![pairs];
    Ok(probed)
}

/// The pairs whose right row passes.
fn kept(pairs: &PairList, mask: &RowMask) -> PairList {
    let mut out = PairList::with_capacity(pairs.len());
    for i in 0..pairs.len() {
        if mask.allows(pairs.right[i] as usize) {
            out.push(pairs.left[i], pairs.right[i], pairs.distance[i]);
        }
    }
    out
}
