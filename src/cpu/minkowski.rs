//! Minkowski's folded pass for the certified filter (`certified.rs`), in place of the generic
//! `folded::accumulate`: there the pair `pow(|x − y|, p) − pow(|x|, p) − pow(|y|, p)` tested p
//! against 1, 2, 3 and 4 inside the loop (`math::pow`), so no loop over postings or dense
//! columns ran on vector lanes, and any other p took three libm `pow` calls per posting: on
//! news20 p = 2 took 4x cosine's time and p = 2.5 thirty times.
//!
//! Here the loops are compiled once per power: p = 1, 2, 3, 4 as `math::pow`'s products (the
//! pair's own bits), any other p as `fast_pow(|x − y|) − |x|ᵖ − |y|ᵖ`, with `|y|ᵖ` of every stored
//! value computed once at build (in `col_lifts` and `dense_lifts`, by the metric's own total
//! term), `|x|ᵖ` once per left value, and `|x − y|ᵖ` as `exp(p·ln|x − y|)` with fdlibm's
//! logarithm (`math::log`, within an ulp) and fdlibm's exponential written out here, both
//! without branches. The filter only needs bounds on the union sum: [`POW_ERROR`] bounds the
//! fast pow's relative error (the logarithm's ulp times |p·ln t| ≤ 709 where the result is
//! finite, plus the exponential's ulp), and `certified.rs` widens its bounds by it; a result
//! under e^−708 is 0 (an absolute error below 1e−307 a term) and one above e^709 is +∞ (the
//! row's bound is then no bound, and the row a candidate). The exact step still computes every
//! candidate's distance by the metric's definition, so the answers are the exact ones.

use std::any::TypeId;

use rayon::prelude::*;

use super::folded::FoldedScratch;
use super::index::{CpuIndex, SPARSE};
use crate::metric::math::{log, pow};
use crate::metric::{Minkowski, RowTotals, Semiring};

/// A bound on the relative error of [`fast_pow`] (3.2e-13 by the analysis above; 2^-40 is 9.1e-13).
pub(crate) const POW_ERROR: f64 = 1.0 / (1u64 << 40) as f64;

/// The absolute error a term may add where its true value is below e^−708.
pub(crate) const POW_FLOOR: f64 = 1e-300;

/// A bound on the relative error of [`HalfProducts`] (its square root in single precision:
/// 1.5·2⁻²⁴ and a few double roundings, within 2⁻²³).
pub(crate) const HALF_POW_ERROR: f64 = 1.0 / (1u64 << 22) as f64;

/// The absolute error a [`HalfProducts`] term may add where t is below float32's normal range
/// (its root taken as that of 2⁻¹²⁶): at most t·2⁻⁶³ ≤ 2⁻¹⁸⁹.
pub(crate) const HALF_POW_FLOOR: f64 = 1e-55;

/// The relative error and the absolute floor the bounds add per term for minkowski of a degree
/// `p` other than 1 to 4, by the power that degree takes.
pub(crate) fn pow_error(p: f64) -> (f64, f64) {
    if [1.5, 2.5, 3.5].contains(&p) {
        (HALF_POW_ERROR, HALF_POW_FLOOR)
    } else {
        (POW_ERROR, POW_FLOOR)
    }
}

/// Postings whose pairs are computed at once before they are scattered.
const RUN: usize = 128;

/// Minkowski's degree p if `S` is minkowski, and whether p takes the fast pow (not 1, 2, 3, 4).
pub(crate) fn minkowski_degree<S: Semiring>(s: &S) -> Option<(f64, bool)> {
    let p = s.params().p;
    let products = [1.0, 2.0, 3.0, 4.0].contains(&p);
    (TypeId::of::<S>() == TypeId::of::<Minkowski>()).then_some((p, !products))
}

/// fdlibm's constants for `exp`, digit for digit.
#[allow(clippy::excessive_precision)]
mod fdlibm {
    pub(super) const LN2_HI: f64 = 6.931_471_803_691_238_164_90e-1;
    pub(super) const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;
    // fdlibm's 1.44269504088896338700, the same double as the standard constant.
    pub(super) const INV_LN2: f64 = std::f64::consts::LOG2_E;
    pub(super) const P1: f64 = 1.666_666_666_666_660_190_37e-1;
    pub(super) const P2: f64 = -2.777_777_777_701_559_338_42e-3;
    pub(super) const P3: f64 = 6.613_756_321_437_934_361_17e-5;
    pub(super) const P4: f64 = -1.653_390_220_546_525_153_25e-6;
    pub(super) const P5: f64 = 4.138_136_797_057_238_460_39e-8;
}

/// e^m within an ulp for m in [−708, 709] (fdlibm's reduction and rational approximation), 0
/// below, +∞ above (and for NaN: never reached, as m = p·ln t of t ≥ 0 is never NaN).
#[inline(always)]
fn exp(m: f64) -> f64 {
    use fdlibm::*;
    // 1.5·2^52: adding it rounds a double below 2^51 to an integer (to nearest, as `rint`).
    const ROUND: f64 = 6_755_399_441_055_744.0;
    let x = m.clamp(-708.0, 709.0);
    let k = (x * INV_LN2 + ROUND) - ROUND;
    // k·LN2_HI is exact (LN2_HI has 32 trailing zero bits and |k| < 1024).
    let hi = x - k * LN2_HI;
    let lo = k * LN2_LO;
    let r = hi - lo;
    let rr = r * r;
    let c = r - rr * (P1 + rr * (P2 + rr * (P3 + rr * (P4 + rr * P5))));
    let y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);
    // 2^k from its biased exponent, without an integer conversion (which AVX2 lacks for f64).
    let scale = f64::from_bits((k + (1023.0 + 4_503_599_627_370_496.0)).to_bits() << 52);
    let e = y * scale;
    if m < -708.0 {
        0.0
    } else if m > 709.0 {
        f64::INFINITY
    } else {
        e
    }
}

/// tᵖ for t ≥ 0 within [`POW_ERROR`] relative (see the module docs), 0 for t = 0.
#[inline(always)]
pub(crate) fn fast_pow(t: f64, p: f64) -> f64 {
    exp(p * log(t))
}

/// `|v|ᵖ` of each value for a p other than 1 to 4, as the folded pass reads them (`col_lifts`,
/// `dense_lifts`; none for a half-integer p, whose pass computes them): by the pass's own power
/// ([`fast_pow`]), within half of [`pow_error`] of the true one as its `|x − y|ᵖ` is (a pair's
/// two powers, each within that, sum to at most `pow_error·parts` over a row, the bound
/// `certified.rs` adds), where a libm pow per stored value made most of the build.
pub(crate) fn filter_powers(p: f64, values: &[f32]) -> Vec<f64> {
    fn with<W: Power + Send + Sync>(w: W, values: &[f32]) -> Vec<f64> {
        let mut out = vec![0.0; values.len()];
        // Chunks, so that each thread's loop runs over contiguous values on vector lanes.
        out.par_chunks_mut(4096)
            .zip(values.par_chunks(4096))
            .for_each(|(out, values)| {
                for (o, &v) in out.iter_mut().zip(values) {
                    *o = w.power((v as f64).abs());
                }
            });
        out
    }
    match p {
        1.5 | 2.5 | 3.5 => Vec::new(),
        _ => with(Fast(p), values),
    }
}

/// `certified.rs`'s folded pass (`folded::accumulate`) for minkowski of degree `p`:
/// `ws.acc0[j]` gets the folded sum over the columns the left row shares with right row j;
/// returns the left row's totals (the metric's, exact).
#[inline(always)]
pub(crate) fn accumulate_minkowski<S: Semiring>(
    s: &S,
    p: f64,
    index: &CpuIndex,
    row: (&[i32], &[f32]),
    ws: &mut FoldedScratch,
) -> RowTotals {
    if p == 1.0 {
        accumulate_power(s, index, row, ws, Products::<1>)
    } else if p == 2.0 {
        accumulate_power(s, index, row, ws, Products::<2>)
    } else if p == 3.0 {
        accumulate_power(s, index, row, ws, Products::<3>)
    } else if p == 4.0 {
        accumulate_power(s, index, row, ws, Products::<4>)
    } else if p == 1.5 {
        accumulate_power(s, index, row, ws, HalfProducts::<1>)
    } else if p == 2.5 {
        accumulate_power(s, index, row, ws, HalfProducts::<2>)
    } else if p == 3.5 {
        accumulate_power(s, index, row, ws, HalfProducts::<3>)
    } else {
        accumulate_power(s, index, row, ws, Fast(p))
    }
}

/// tᵖ for t ≥ 0, one implementation per kind of p, so that each loop over postings is compiled
/// for its own (a closure passed in was not inlined into the vectorised loops).
trait Power: Copy {
    /// `|y|ᵖ` is read from the index's lifts rather than computed.
    const LIFTS: bool;
    /// Dense columns are added four a pass (one a pass where the compiler did not unroll the
    /// four into the loop over rows: the fast pow).
    const GROUPED: bool;
    /// Lists and dense columns of few distinct values take a pair per distinct value, by code
    /// (where the pair costs more than a product).
    const CODED: bool;
    fn power(self, t: f64) -> f64;

    /// The folded pair of left value x (with `|x|ᵖ`) and right value y, with `|y|ᵖ` from `lifts`
    /// at `at` (if `LIFTS`).
    #[inline(always)]
    fn pair(self, (x, px): (f64, f64), y: f32, lifts: &[f64], at: usize) -> f64 {
        let y = y as f64;
        let py = if Self::LIFTS {
            lifts[at]
        } else {
            self.power(y.abs())
        };
        self.power((x - y).abs()) - px - py
    }
}

/// p = P in 1..=4: `math::pow`'s products.
#[derive(Clone, Copy)]
struct Products<const P: u32>;

impl<const P: u32> Power for Products<P> {
    const LIFTS: bool = false;
    const GROUPED: bool = true;
    const CODED: bool = false;
    #[inline(always)]
    fn power(self, t: f64) -> f64 {
        pow(t, P as f64)
    }
}

/// p = N + ½ for N in 1..=3: `tᴺ·√t`, N − 1 products, a square root and a product. Where
/// [`fast_pow`]'s exponential of a logarithm (two divisions and some forty operations a pair)
/// made p = 2.5 take 3.1x cosine's time on news20 against 1.8x for p = 3. The square root is
/// taken in single precision: a double's (`vsqrtpd`) was most of p = 2.5's probe on anchors.py's
/// scrna_full shape, and a float's does twice the lanes at a fraction of the latency. t to
/// float32 is within 2⁻²⁴ relative, its root within 2⁻²⁴ more, so tᵖ is within
/// [`HALF_POW_ERROR`] / 2 where t is a normal float32; a t of 2¹²⁸ or more (a difference of two
/// huge values) gives +∞, no bound (the row a candidate), and a t below 2⁻¹²⁶ the root of 2⁻¹²⁶,
/// an absolute error under [`HALF_POW_FLOOR`].
#[derive(Clone, Copy)]
struct HalfProducts<const N: u32>;

impl<const N: u32> Power for HalfProducts<N> {
    // |y|ᵖ is computed, not read: at a float square root a value, cheaper than the 8 bytes of a
    // lift (scrna_full's probe, bound by its reads of postings, took 8.8 s with lifts).
    const LIFTS: bool = false;
    const GROUPED: bool = true;
    const CODED: bool = true;
    #[inline(always)]
    fn power(self, t: f64) -> f64 {
        let whole = match N {
            1 => t,
            2 => t * t,
            _ => t * t * t,
        };
        whole * (t as f32).max(f32::MIN_POSITIVE).sqrt() as f64
    }
}

/// Any other p: [`fast_pow`].
#[derive(Clone, Copy)]
struct Fast(f64);

impl Power for Fast {
    const LIFTS: bool = true;
    const GROUPED: bool = false;
    const CODED: bool = true;
    #[inline(always)]
    fn power(self, t: f64) -> f64 {
        fast_pow(t, self.0)
    }
}

/// [`accumulate_minkowski`] for one [`Power`].
#[inline(always)]
fn accumulate_power<S: Semiring, W: Power>(
    s: &S,
    index: &CpuIndex,
    (indices, values): (&[i32], &[f32]),
    ws: &mut FoldedScratch,
    w: W,
) -> RowTotals {
    let n = index.rows;
    let prm = s.params();
    let left_totals = s.totals(values.iter().copied().filter(|v| *v != 0.0));
    let (dense, sparse) = (&mut ws.dense_hits, &mut ws.sparse_hits);
    let coded_dense = &mut ws.coded_hits;
    dense.clear();
    sparse.clear();
    coded_dense.clear();
    for (&c, &x) in indices.iter().zip(values) {
        if x == 0.0 {
            continue;
        }
        if let Some(col) = index.columns.get(c) {
            match index.dense_slot[col as usize] {
                SPARSE => sparse.push((col, x)),
                slot if W::CODED && index.dense_codes.column(slot, n).is_some() => {
                    coded_dense.push((slot, x))
                }
                slot => dense.push((slot, x)),
            }
        }
    }
    let acc = &mut ws.acc0[..n];
    // (x, |x|ᵖ) of a left value, by the metric's total term.
    let left = |x: f32| (x as f64, S::total0(x as f64, &prm));

    let range = |slot: u32| slot as usize * n..(slot as usize + 1) * n;
    let column = |slot: u32| {
        let lifts = if W::LIFTS {
            &index.dense_lifts[range(slot)]
        } else {
            &[][..]
        };
        // Cut to n again: the loops below then index them without bounds checks.
        let lifts = if W::LIFTS { &lifts[..n] } else { lifts };
        (&index.dense_vals[range(slot)][..n], lifts)
    };
    // Four columns a pass where the pair is a few products (and a square root); one where it is
    // the fast pow, whose loop over four columns was not unrolled, so its loop over rows ran one
    // row at a time. A pass a column read and wrote the accumulator once per column: on
    // scrna_full (120 dense columns a left row) p = 2.5's pass was bound by that traffic.
    let grouped = if W::GROUPED { &dense[..] } else { &[][..] };
    let mut groups = grouped.chunks_exact(4);
    for g in &mut groups {
        let cols = [
            column(g[0].0),
            column(g[1].0),
            column(g[2].0),
            column(g[3].0),
        ];
        let xs = [left(g[0].1), left(g[1].1), left(g[2].1), left(g[3].1)];
        // `j` indexes the four columns, the pair's row and `acc` alike.
        #[allow(clippy::needless_range_loop)]
        for j in 0..n {
            let mut a = 0.0;
            for g in 0..4 {
                let y = cols[g].0[j];
                let t = w.pair(xs[g], y, cols[g].1, j);
                // A row without the column (a stored zero) shares nothing here.
                a += if y != 0.0 { t } else { 0.0 };
            }
            acc[j] += a;
        }
    }
    let rest = if W::GROUPED {
        groups.remainder()
    } else {
        &dense[..]
    };
    for &(slot, x) in rest {
        let ((vals, lifts), x) = (column(slot), left(x));
        for j in 0..n {
            let y = vals[j];
            let t = w.pair(x, y, lifts, j);
            acc[j] += if y != 0.0 { t } else { 0.0 };
        }
    }

    let mut coded = [0.0f64; 256];
    // Coded dense columns: a pair per distinct value, a byte per row (`dense_codes.rs`).
    for &(slot, x) in coded_dense.iter() {
        let Some((distinct, lifts, codes)) = index.dense_codes.column(slot, n) else {
            continue;
        };
        let x = left(x);
        coded[0] = 0.0;
        for (i, &y) in distinct.iter().enumerate() {
            coded[i + 1] = w.pair(x, y, lifts, i);
        }
        for (a, &code) in acc.iter_mut().zip(codes) {
            *a += coded[code as usize];
        }
    }

    let mut terms = [0.0f64; RUN];
    for &(col, x) in sparse.iter() {
        let x = left(x);
        let (start, end) = (index.col_ptr[col as usize], index.col_ptr[col as usize + 1]);
        if let Some((distinct, lifts)) = index.coded_column(col as usize).filter(|_| W::CODED) {
            // A list of few distinct values (counts): the pair of each once, a code per posting.
            for (i, (t, &y)) in coded.iter_mut().zip(distinct).enumerate() {
                *t = w.pair(x, y, lifts, i);
            }
            for (&j, &code) in index.col_rows[start..end]
                .iter()
                .zip(&index.col_codes[start..end])
            {
                acc[j as usize] += coded[code as usize];
            }
            continue;
        }
        let mut at = start;
        while at < end {
            let len = RUN.min(end - at);
            let (rows, vals) = (&index.col_rows[at..at + len], &index.col_vals[at..at + len]);
            let lifts = if W::LIFTS {
                &index.col_lifts[at..at + len]
            } else {
                &[][..]
            };
            let terms = &mut terms[..len];
            for i in 0..len {
                terms[i] = w.pair(x, vals[i], lifts, i);
            }
            for (&j, &t) in rows.iter().zip(terms.iter()) {
                acc[j as usize] += t;
            }
            at += len;
        }
    }
    left_totals
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Against libm's `powf` over f32 differences as the pass forms them and degrees from 1 to
    /// 60: relative error well inside `POW_ERROR` wherever the result is a normal double, 0 where
    /// it underflows, +∞ only where it is beyond e^709.
    #[test]
    fn fast_pow_is_within_its_error_bound() {
        let mut rng = StdRng::seed_from_u64(41);
        let mut worst = 0.0f64;
        for case in 0..400_000 {
            let p = if case % 4 == 0 {
                rng.random_range(1.0..3.0)
            } else {
                rng.random_range(1.0..60.0)
            };
            let bits = rng.random_range(0..0x7f7f_ffffu32);
            let (x, y) = (f32::from_bits(bits), rng.random_range(-4.0f32..4.0));
            let t = (x as f64 - y as f64).abs();
            let (ours, want) = (fast_pow(t, p), t.powf(p));
            let m = p * t.ln();
            if (m - 709.0).abs() < 1e-6 || (m + 708.0).abs() < 1e-6 {
                // At the cut, rounding may put either side of it.
                continue;
            }
            if m > 709.0 {
                assert!(ours == f64::INFINITY, "{t}^{p}");
            } else if m < -708.0 {
                assert!(
                    ours == 0.0 && want < 1e-300,
                    "{t}^{p} = {ours:e}, want {want:e}"
                );
            } else if want >= f64::MIN_POSITIVE {
                let err = (ours - want).abs() / want;
                worst = worst.max(err);
                assert!(err <= POW_ERROR / 2.0, "{t}^{p} = {ours:e}, want {want:e}");
            } else {
                assert!((ours - want).abs() <= POW_FLOOR, "{t}^{p}");
            }
        }
        assert!(worst > 0.0);
        // The half-integer powers' products and square root, over the same differences, and over
        // values of every size (a row's own |y|ᵖ).
        let mut half_worst = 0.0f64;
        for case in 0..200_000 {
            let bits = rng.random_range(0..0x7f7f_ffffu32);
            let x = f32::from_bits(bits);
            let y = match case % 4 {
                // A huge difference (past float32's range) and a tiny one (below its normals).
                0 => -f32::from_bits(rng.random_range(0..0x7f7f_ffffu32)),
                1 => f32::from_bits(bits ^ 1),
                _ => rng.random_range(-4.0f32..4.0),
            };
            let t = (x as f64 - y as f64).abs();
            let (ours, p) = match case % 3 {
                0 => (HalfProducts::<1>.power(t), 1.5),
                1 => (HalfProducts::<2>.power(t), 2.5),
                _ => (HalfProducts::<3>.power(t), 3.5),
            };
            let want = t.powf(p);
            assert!(want == 0.0 || want.is_normal(), "{t}^{p} = {want:e}");
            if t >= f32::MAX as f64 {
                // No bound: the row becomes a candidate.
                assert!(
                    ours == f64::INFINITY || (ours - want).abs() <= HALF_POW_ERROR / 2.0 * want
                );
                continue;
            }
            assert!(
                (ours - want).abs() <= HALF_POW_ERROR / 2.0 * want + HALF_POW_FLOOR,
                "{t}^{p} = {ours:e}, want {want:e}"
            );
            if want > 0.0 {
                half_worst = half_worst.max((ours - want).abs() / want);
            }
        }
        assert!(half_worst > 1e-9, "single precision shows: {half_worst:e}");
        assert_eq!(fast_pow(0.0, 2.5), 0.0);
        assert_eq!(fast_pow(1.0, 7.3), 1.0);
    }
}
