//! jensenshannon's folded pair as the certified filter (`certified.rs`) computes it: within
//! [`JS_PAIR_ERROR`]`·(x + y)` of the definition's pair, at about half its cost.
//!
//! The definition's pair `x·(ln x − ln m) + y·(ln y − ln m) − (x + y)·ln 2`, m = (x + y)/2, takes
//! a full logarithm of m per posting and per dense row (fdlibm's reduction, a division and a
//! degree-7 polynomial): on anchors.py's movielens_full shape (random floats, so no coded lists)
//! that was most of a jensenshannon join, 5x cosine's time. The same pair is
//! `x ln x + y ln y − (x + y)·ln(x + y)`; with a = min(x, y), b = max(x, y) and q = a/b ∈ (0, 1]
//! it is `a·(ln a − ln b) − (a + b)·ln(1 + q)`. `ln a` and `ln b` are the lifts the index already
//! holds, and `ln(1 + q)` of a q in (0, 1] needs no range reduction: it is `2·atanh(s)`,
//! s = q/(2 + q) ∈ (0, 1/3], whose odd series up to s¹¹ is within `2·s¹³/13·9/8 ≤ 1.09e-7` (at
//! q = 1). Every rounding adds at most ~1e-13·(a + b) beside it (lifts within an ulp of
//! |ln v| ≤ 104, a division, a few products), so the pair is within 2⁻²² (2.4e-7) of the true one
//! times (x + y), and Σ(x + y) over shared columns is at most (L + R)/ln 2 ≤ the bound's `parts`.
//! The filter only needs bounds, and the true k nearest of every data set we measured lie more
//! than 1e-5·(L + R) from the rest (news20, pbmc, movielens_full, scrna_full: 10.0 candidates a
//! row at that slack, 10.0 at 1e-7), so the wider bound costs no candidates; the answers still
//! come from the exact step.

use crate::metric::{JensenShannon, KeyForm, Params, Reduction, RowTotals, Semiring, Source};

/// A bound on `|pair − true pair| / (x + y)` of [`JsFilter`] (see the module docs).
pub(crate) const JS_PAIR_ERROR: f64 = 1.0 / (1u64 << 22) as f64;

/// jensenshannon with the filter's pair; everything else is the metric's own.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JsFilter(pub(crate) JensenShannon);

/// ln(1 + q) for q in [0, 1], within 1.09e-7 (see the module docs).
#[inline(always)]
fn ln_1p_unit(q: f64) -> f64 {
    let s = q / (2.0 + q);
    let z = s * s;
    let p = z.mul_add(2.0 / 11.0, 2.0 / 9.0);
    let p = z.mul_add(p, 2.0 / 7.0);
    let p = z.mul_add(p, 2.0 / 5.0);
    let p = z.mul_add(p, 2.0 / 3.0);
    let p = z.mul_add(p, 2.0);
    s * p
}

impl Semiring for JsFilter {
    const NAME: &'static str = JensenShannon::NAME;
    const REDUCTION: Reduction = JensenShannon::REDUCTION;
    const SIMILARITY: bool = JensenShannon::SIMILARITY;
    const KEY: KeyForm = JensenShannon::KEY;
    const PAIR_VANISHES: bool = JensenShannon::PAIR_VANISHES;
    const TWO_ACCUMULATORS: bool = JensenShannon::TWO_ACCUMULATORS;
    const LIFTED: bool = JensenShannon::LIFTED;
    const SOURCE: Source = JensenShannon::SOURCE;
    const FINISH_INCREASING: bool = JensenShannon::FINISH_INCREASING;
    const ROUNDING_GROWTH: f64 = JensenShannon::ROUNDING_GROWTH;

    #[inline(always)]
    fn params(&self) -> Params {
        self.0.params()
    }
    #[inline(always)]
    fn total0(x: f64, prm: &Params) -> f64 {
        JensenShannon::total0(x, prm)
    }
    #[inline(always)]
    fn total1(x: f64, prm: &Params) -> f64 {
        JensenShannon::total1(x, prm)
    }
    #[inline(always)]
    fn lift_raw(v: f64, prm: &Params) -> f64 {
        JensenShannon::lift_raw(v, prm)
    }
    /// x, y > 0 (the callers skip zeros, as for the definition's pair).
    #[inline(always)]
    fn pair0(x: f64, y: f64, lift_x: f64, lift_y: f64, _: &Params) -> f64 {
        let y_less = y < x;
        let (a, b) = if y_less { (y, x) } else { (x, y) };
        let (la, lb) = if y_less {
            (lift_y, lift_x)
        } else {
            (lift_x, lift_y)
        };
        a * (la - lb) - (a + b) * ln_1p_unit(a / b)
    }
    #[inline(always)]
    fn pair1(x: f64, y: f64, lift_x: f64, lift_y: f64, prm: &Params) -> f64 {
        JensenShannon::pair1(x, y, lift_x, lift_y, prm)
    }
    #[inline(always)]
    fn finish_raw(acc0: f64, acc1: f64, l: &RowTotals, r: &RowTotals, prm: &Params) -> f64 {
        JensenShannon::finish_raw(acc0, acc1, l, r, prm)
    }
    #[inline(always)]
    fn exact_term(x: f64, y: f64, prm: &Params) -> Option<f64> {
        JensenShannon::exact_term(x, y, prm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// The pair of every kind of float32 pair (random bits over the whole positive range, values
    /// near each other, equal values, counts) against the float64 definition's pair computed
    /// with libm's `ln` (each within an ulp): within `JS_PAIR_ERROR·(x + y)`, with room.
    #[test]
    fn filter_pair_is_within_its_error_bound() {
        let js = JsFilter(JensenShannon(Params::default()));
        let mut rng = StdRng::seed_from_u64(36);
        let mut worst = 0.0f64;
        for case in 0..400_000 {
            let (x, y): (f32, f32) = match case % 4 {
                0 => (
                    f32::from_bits(rng.random_range(1..0x7f7f_ffffu32)),
                    f32::from_bits(rng.random_range(1..0x7f7f_ffffu32)),
                ),
                1 => {
                    let x = rng.random_range(1.0f32..5.0);
                    (x, x * rng.random_range(0.999f32..1.001))
                }
                2 => {
                    let x = rng.random_range(1e-30f32..1e30);
                    (x, x)
                }
                _ => (
                    rng.random_range(1..100_000) as f32,
                    rng.random_range(1..100) as f32,
                ),
            };
            let (xd, yd) = (x as f64, y as f64);
            let want = xd * xd.ln() + yd * yd.ln() - (xd + yd) * (xd + yd).ln();
            let ours = js.pair(x, y).0;
            let err = (ours - want).abs() / (xd + yd);
            // `want` itself is rounded relative to x·|ln x|, up to 104·(x + y) ulps.
            let slack = 256.0 * f64::EPSILON * (xd * xd.ln().abs() + yd * yd.ln().abs() + 1.0);
            assert!(
                err <= JS_PAIR_ERROR / 2.0 + slack / (xd + yd),
                "x {x:e} y {y:e}: {ours:e} against {want:e}"
            );
            worst = worst.max(err);
        }
        assert!(worst > 1e-9, "the bound is not vacuous: worst {worst:e}");
        // Symmetric in x and y, as the definition's pair is.
        for _ in 0..1000 {
            let (x, y) = (rng.random_range(0.1f32..9.0), rng.random_range(0.1f32..9.0));
            assert_eq!(js.pair(x, y).0, js.pair(y, x).0);
        }
    }
}
