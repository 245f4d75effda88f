//! The exact distances of a certified metric's candidates (minkowski, hellinger, jensenshannon),
//! computed over the union on the host: the right side's rows kept sorted by column, each with its
//! one-sided sum, and for metrics whose distance grows with those sums
//! ([`Semiring::FINISH_INCREASING`]) the rows ordered by that sum, so that a left row's nearest
//! rows among those it shares no column with are read off the front of that order.
//!
//! Why the last part: rows that share no column with a left row tie in large groups (every short
//! row of one rating is at the same distance), and any bound of nonzero width on them admits a
//! whole group as candidates. Their exact distance needs no walk and no bound: it is
//! [`disjoint_distance`] of the two one-sided sums. So the kernels skip such pairs and the host
//! takes them from here.

use rayon::prelude::*;

use super::Selection;
use crate::metric::{
    disjoint_distance, one_sided_sum, sorted_nonzeros_into, union_distance, RowTotals, Semiring,
    Side,
};
use crate::vector::SparseBatch;

/// How far a distance computed from a larger sum may fall below one from a smaller sum: the
/// rounding of a `pow` in `finish` (under an ulp); a scan goes on while a group's distance is
/// within this of its limit.
const NON_MONOTONE_SLACK: f64 = 1.0 / (1u64 << 40) as f64;

type WalkFn = Box<dyn Fn(&[(i32, f32)], &[(i32, f32)]) -> f64 + Send + Sync>;
type OneSidedFn = Box<dyn Fn(&[(i32, f32)]) -> f64 + Send + Sync>;
type DisjointFn = Box<dyn Fn(f64, f64) -> f64 + Send + Sync>;
type FinishFn = Box<dyn Fn(f64) -> f64 + Send + Sync>;

/// A right side's rows as the exact step of a certified metric reads them.
pub struct ExactRows {
    ptr: Vec<usize>,
    entries: Vec<(i32, f32)>,
    /// Each right row's [`one_sided_sum`].
    one_sided: Vec<f64>,
    /// With [`Semiring::FINISH_INCREASING`]: the valid rows by (one-sided sum, row).
    by_sum: Option<SumOrder>,
    walk: WalkFn,
    left_one_sided: OneSidedFn,
    disjoint: DisjointFn,
    finish: FinishFn,
}

/// Valid right rows in (one-sided sum, row) order, cut into groups of one sum: the rows of a
/// group are all at one distance from a left row they share no column with.
struct SumOrder {
    rows: Vec<u32>,
    /// (sum, first position in `rows`) of each group.
    groups: Vec<(f64, usize)>,
}

impl ExactRows {
    pub fn new<S: Semiring>(s: S, right: &SparseBatch) -> Self {
        // Rows copied in parallel into their places (28M entries at the movielens shape).
        let lens: Vec<usize> = (0..right.len())
            .into_par_iter()
            .map(|r| right.row(r).1.iter().filter(|&&v| v != 0.0).count())
            .collect();
        let mut ptr = Vec::with_capacity(right.len() + 1);
        ptr.push(0);
        for len in &lens {
            ptr.push(ptr.last().expect("ptr starts at 0") + len);
        }
        let mut entries = vec![(0i32, 0f32); ptr[right.len()]];
        let mut rows_out = Vec::with_capacity(right.len());
        let mut rest = &mut entries[..];
        for len in &lens {
            let (row, tail) = rest.split_at_mut(*len);
            rows_out.push(row);
            rest = tail;
        }
        rows_out
            .into_par_iter()
            .enumerate()
            .for_each_init(Vec::new, |buffer, (r, out)| {
                sorted_nonzeros_into(right.row(r), buffer);
                out.copy_from_slice(buffer);
            });
        let one_sided: Vec<f64> = (0..right.len())
            .into_par_iter()
            .map(|j| one_sided_sum(&s, &entries[ptr[j]..ptr[j + 1]], Side::Right))
            .collect();
        let by_sum = S::FINISH_INCREASING.then(|| {
            let mut rows: Vec<u32> = (0..right.len() as u32)
                .filter(|&j| !right.is_null(j as usize))
                .collect();
            rows.par_sort_unstable_by(|&a, &b| {
                one_sided[a as usize]
                    .total_cmp(&one_sided[b as usize])
                    .then(a.cmp(&b))
            });
            let mut groups: Vec<(f64, usize)> = Vec::new();
            for (i, &j) in rows.iter().enumerate() {
                let sum = one_sided[j as usize];
                if groups.last().is_none_or(|g| g.0.to_bits() != sum.to_bits()) {
                    groups.push((sum, i));
                }
            }
            SumOrder { rows, groups }
        });
        let zero = RowTotals::default();
        Self {
            ptr,
            entries,
            one_sided,
            by_sum,
            walk: Box::new(move |a, b| union_distance(&s, a, b)),
            left_one_sided: Box::new(move |a| one_sided_sum(&s, a, Side::Left)),
            disjoint: Box::new(move |l, r| disjoint_distance(&s, l, r)),
            finish: Box::new(move |reduced| s.finish(reduced, 0.0, &zero, &zero)),
        }
    }

    /// The right rows as this keeps them: row pointers into the entries, each row's nonzeros
    /// sorted by column (the GPU's exact step walks a copy of them on the device).
    pub fn sorted_rows(&self) -> (&[usize], &[(i32, f32)]) {
        (&self.ptr, &self.entries)
    }

    /// The distance of a pair from its terms over the union reduced (summed in
    /// [`union_distance`]'s order, or their max): `finish` with zero totals, as
    /// [`union_distance`] ends.
    pub fn finish_reduced(&self, reduced: f64) -> f64 {
        (self.finish)(reduced)
    }

    fn right_row(&self, j: usize) -> &[(i32, f32)] {
        &self.entries[self.ptr[j]..self.ptr[j + 1]]
    }

    /// A left row's [`one_sided_sum`] (`x` sorted as [`sorted_nonzeros`] gives it).
    pub fn left_one_sided(&self, x: &[(i32, f32)]) -> f64 {
        (self.left_one_sided)(x)
    }

    /// Left row `x` (sorted nonzeros, with its one-sided sum) against right row `j`: a walk with
    /// the exact term where they share a column, else from the rows' one-sided sums.
    pub fn distance(&self, x: &[(i32, f32)], x_one_sided: f64, j: usize) -> f64 {
        let y = self.right_row(j);
        if shares_a_column(x, y) {
            (self.walk)(x, y)
        } else {
            (self.disjoint)(x_one_sided, self.one_sided[j])
        }
    }

    /// Whether the rows sharing no column with a left row are found here (by
    /// [`ExactRows::disjoint_rows`]) rather than left to the kernels' bounds.
    pub fn finds_disjoint_rows(&self) -> bool {
        self.by_sum.is_some()
    }

    /// The right rows that share no column with left row `x` (sorted nonzeros, one-sided sum
    /// `x_one_sided`) and are in the answer of `selection` among such rows: the k nearest in the
    /// SPEC's order (distance, then row), or all within the radius (in order of distance);
    /// `skip` is a right row left out (exclude_self). Empty unless
    /// [`ExactRows::finds_disjoint_rows`].
    pub fn disjoint_rows(
        &self,
        x: &[(i32, f32)],
        x_one_sided: f64,
        selection: Selection,
        skip: Option<usize>,
    ) -> Vec<(f64, u32)> {
        let Some(order) = &self.by_sum else {
            return Vec::new();
        };
        let mut out: Vec<(f64, u32)> = Vec::new();
        for (g, &(sum, start)) in order.groups.iter().enumerate() {
            let end = order.groups.get(g + 1).map_or(order.rows.len(), |n| n.1);
            let distance = (self.disjoint)(x_one_sided, sum);
            let limit = match selection {
                Selection::Nearest(k) if out.len() < k => f64::INFINITY,
                Selection::Nearest(_) => out.last().expect("k > 0 rows").0,
                Selection::Within(radius) => radius,
            };
            // Later groups have larger sums, so distances at least this one's (to the slack).
            if distance > limit + limit.abs() * NON_MONOTONE_SLACK {
                break;
            }
            if distance > limit {
                continue;
            }
            for &j in &order.rows[start..end] {
                if skip == Some(j as usize) || shares_a_column(x, self.right_row(j as usize)) {
                    continue;
                }
                match selection {
                    Selection::Nearest(k) => {
                        if k == 0 {
                            break;
                        }
                        // Rows of a group come by row: once one cannot enter, none after it can.
                        if out.len() == k && (distance, j) >= *out.last().expect("k rows") {
                            break;
                        }
                        let at = out.partition_point(|e| {
                            e.0.total_cmp(&distance).then(e.1.cmp(&j)).is_lt()
                        });
                        out.insert(at, (distance, j));
                        out.truncate(k);
                    }
                    Selection::Within(_) => out.push((distance, j)),
                }
            }
        }
        out
    }

    pub fn memory_size(&self) -> usize {
        let order = self
            .by_sum
            .as_ref()
            .map_or(0, |o| o.rows.len() * 4 + o.groups.len() * 16);
        self.ptr.len() * 8 + self.entries.len() * 8 + self.one_sided.len() * 8 + order
    }
}

/// Whether two rows sorted by column have a column in common: a walk of both, or binary searches
/// of the short row's columns in the long one when that is cheaper (a long left row checked
/// against many short right rows).
fn shares_a_column(a: &[(i32, f32)], b: &[(i32, f32)]) -> bool {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    if short.len() * (usize::BITS - long.len().leading_zeros()) as usize >= short.len() + long.len()
    {
        return crate::metric::share_a_column(a, b);
    }
    short
        .iter()
        .any(|e| long.binary_search_by_key(&e.0, |f| f.0).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::{Hellinger, JensenShannon, Minkowski, Params};
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// Rows of few columns and small counts, so that many pairs share no column and many tie.
    fn tied_rows(rows: usize, seed: u64) -> Vec<Vec<(i32, f32)>> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..rows)
            .map(|_| {
                let len = if rng.random_bool(0.7) {
                    rng.random_range(0..3)
                } else {
                    rng.random_range(3..40)
                };
                let mut cols: Vec<i32> = (0..len).map(|_| rng.random_range(0..60)).collect();
                cols.sort_unstable();
                cols.dedup();
                cols.into_iter()
                    .map(|c| (c, [1.0f32, 2.0, 3.0, 4000.0][rng.random_range(0..4)]))
                    .collect()
            })
            .collect()
    }

    /// Every selection from `disjoint_rows` against a brute force over all rows that share no
    /// column: same rows, same distances, same order.
    fn check<S: Semiring>(s: S) {
        let rows = tied_rows(400, 7);
        let mut nulls = vec![false; rows.len()];
        nulls[5] = true;
        let right = SparseBatch::from_rows(
            rows.iter()
                .zip(&nulls)
                .map(|(r, &null)| (!null).then_some(&r[..])),
        );
        let exact = ExactRows::new(s, &right);
        assert!(exact.finds_disjoint_rows());
        for (l, x) in tied_rows(40, 8).iter().enumerate() {
            let sx = exact.left_one_sided(x);
            let skip = Some(l * 3);
            let mut brute: Vec<(f64, u32)> = (0..rows.len())
                .filter(|&j| !nulls[j] && Some(j) != skip && !shares_a_column(x, &rows[j]))
                .map(|j| (union_distance(&s, x, &rows[j]), j as u32))
                .collect();
            brute.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            for k in [1, 3, 10, 1000] {
                let got = exact.disjoint_rows(x, sx, Selection::Nearest(k), skip);
                assert_eq!(
                    got,
                    brute[..k.min(brute.len())],
                    "{} k={k} row {l}",
                    S::NAME
                );
            }
            for radius in [0.0, brute[brute.len() / 3].0, f64::INFINITY] {
                let mut got = exact.disjoint_rows(x, sx, Selection::Within(radius), skip);
                got.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let want: Vec<_> = brute.iter().copied().filter(|e| e.0 <= radius).collect();
                assert_eq!(got, want, "{} radius {radius} row {l}", S::NAME);
            }
        }
    }

    #[test]
    fn disjoint_rows_equal_a_brute_force_over_the_union() {
        let prm = |p| Params { p, d: 1.0 };
        check(Minkowski(prm(3.0)));
        check(Minkowski(prm(2.0)));
        check(Hellinger(prm(2.0)));
        check(JensenShannon(prm(2.0)));
    }

    #[test]
    fn column_test_agrees_with_the_walk() {
        let rows = tied_rows(200, 9);
        for a in &rows {
            for b in &rows[..50] {
                assert_eq!(shares_a_column(a, b), crate::metric::share_a_column(a, b));
            }
        }
    }
}
