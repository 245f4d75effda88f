//! The exact step of the certified sum metrics (minkowski, hellinger, jensenshannon): a
//! candidate's distance over the union of its columns and the left row's, bit for bit
//! `metric::union_distance` (the function the GPU's exact step runs), at a fraction of its cost.
//!
//! `union_distance` adds three sums, each in column order: the left-only terms `term(x, 0)`, the
//! right-only terms `term(0, y)` and the shared terms `term(x, y)`. The one-sided terms depend on
//! one value alone: the index keeps `term(0, y)` of every right entry (`UnionRows`) and
//! the probe computes `term(x, 0)` once per left entry, so a candidate evaluates the metric's
//! term (a `pow` of a non-integer p, jensenshannon's two logarithms) only on the columns it
//! shares with the left row. The walk is no merge either: the left row is scattered once into a
//! table by column id, and each right entry looks its column up there, adding its right-only term
//! or `+0.0` (an accumulator that starts at `+0.0` never holds `−0.0`, so adding `+0.0` leaves
//! its bits as skipping the term would). On news20 a merge of two rows mispredicted a branch on
//! most entries and a non-integer p took a `pow` per entry.

use rayon::prelude::*;

use super::index::{ColumnMap, CpuIndex};
use crate::metric::{RowTotals, Semiring};

/// Beside each entry of `CpuIndex::row_entries`: its column id and its right-only term.
#[derive(Debug, Default)]
pub(crate) struct UnionRows {
    pub(crate) cols: Vec<u32>,
    /// `term(0, y)`: the entry's term against a left row that lacks its column.
    pub(crate) terms: Vec<f64>,
}

impl UnionRows {
    /// Derived from the index's `columns` and `row_entries` (an index read from a file derives
    /// them again, so they are not part of its format); None if an entry's column is not in
    /// `columns` (a damaged file: a built index has every column of its rows).
    pub(crate) fn derive<S: Semiring>(
        s: &S,
        columns: &ColumnMap,
        row_entries: &[(i32, f32)],
    ) -> Option<Self> {
        Some(UnionRows {
            cols: (row_entries.iter())
                .map(|&(c, _)| columns.get(c))
                .collect::<Option<_>>()?,
            terms: (row_entries.par_iter())
                .map(|&(_, y)| s.term(0.0, y as f64))
                .collect(),
        })
    }

    /// Entries held (each a u32 and an f64).
    pub(crate) fn len(&self) -> usize {
        self.cols.len()
    }
}

/// One left row as the exact step reads it; scratch of one thread, reused across left rows.
#[derive(Debug, Default)]
pub(crate) struct UnionLeft {
    /// Per column id of the right side: (`stamp` when the left row holds it, its entry there).
    slots: Vec<(u32, u32)>,
    stamp: u32,
    /// The left row's nonzero values, sorted by index, and their `term(x, 0)`.
    values: Vec<f64>,
    terms: Vec<f64>,
    /// The left row's sum of `terms`, in order (its `metric::one_sided_sum`).
    one_sided: f64,
    /// Per left entry: the candidate (`visit`) that last shared its column.
    hit: Vec<u32>,
    visit: u32,
    /// A candidate's shared columns: (left entry, right entry).
    shared: Vec<(u32, u32)>,
}

impl UnionLeft {
    /// Takes the left row (its nonzeros sorted by index, as `metric::sorted_nonzeros` gives
    /// them) and its `one_sided_sum`.
    pub(crate) fn set<S: Semiring>(
        &mut self,
        s: &S,
        index: &CpuIndex,
        left: &[(i32, f32)],
        one_sided: f64,
    ) {
        if self.slots.len() != index.column_count {
            self.slots = vec![(0, 0); index.column_count];
            self.stamp = 0;
        }
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.slots.fill((0, 0));
            self.stamp = 1;
        }
        self.values.clear();
        self.terms.clear();
        for (i, &(c, x)) in left.iter().enumerate() {
            if let Some(col) = index.columns.get(c) {
                self.slots[col as usize] = (self.stamp, i as u32);
            }
            self.values.push(x as f64);
            self.terms.push(s.term(x as f64, 0.0));
        }
        self.one_sided = one_sided;
        self.hit.clear();
        self.hit.resize(left.len(), 0);
        self.visit = 0;
        self.shared.clear();
        self.shared.resize(left.len(), (0, 0));
    }

    /// `metric::union_distance` of the left row and right row `j`, the same bits.
    #[inline(always)]
    pub(crate) fn distance<S: Semiring>(&mut self, s: &S, index: &CpuIndex, j: usize) -> f64 {
        self.visit = self.visit.wrapping_add(1);
        if self.visit == 0 {
            self.hit.fill(0);
            self.visit = 1;
        }
        let (start, end) = (index.row_ptr[j], index.row_ptr[j + 1]);
        let cols = &index.union_rows.cols[start..end];
        let terms = &index.union_rows.terms[start..end];
        let (slots, stamp) = (&self.slots[..], self.stamp);
        let shared = &mut self.shared[..];
        let mut found = 0usize;
        let mut only_right = 0.0f64;
        for (q, (&c, &t)) in cols.iter().zip(terms).enumerate() {
            let (at, i) = slots[c as usize];
            let mine = at == stamp;
            only_right += if mine { 0.0 } else { t };
            // Written always, kept only when shared: the row's shared columns are at most the
            // left row's entries, and the slot past the last one kept is overwritten next.
            if found < shared.len() {
                shared[found] = (i, q as u32);
            }
            found += mine as usize;
        }
        let mut both = 0.0f64;
        let mut only_left = self.one_sided;
        if found > 0 {
            let entries = &index.row_entries[start..end];
            for &(i, q) in &shared[..found] {
                both += s.term(self.values[i as usize], entries[q as usize].1 as f64);
                self.hit[i as usize] = self.visit;
            }
            only_left = 0.0;
            for (&t, &h) in self.terms.iter().zip(&self.hit) {
                only_left += if h == self.visit { 0.0 } else { t };
            }
        }
        let zero = RowTotals::default();
        s.finish(only_left + only_right + both, 0.0, &zero, &zero)
    }
}
