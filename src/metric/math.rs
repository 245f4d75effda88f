//! The vocabulary of metric formulas: every function and constant a formula in
//! [`super::catalog`] may use. Each has a CUDA twin of the same name and meaning in
//! `kernels/metric_prelude.cuh`, so one formula text is both Rust and CUDA C (see
//! [`crate::semiring!`]). Add a function here and there together.

/// +∞ (kl_divergence when the right side lacks a column the left side has).
pub const INF: f64 = f64::INFINITY;
pub const LN_2: f64 = std::f64::consts::LN_2;
pub const SQRT_2: f64 = std::f64::consts::SQRT_2;

#[inline(always)]
pub fn fabs(x: f64) -> f64 {
    x.abs()
}

#[inline(always)]
pub fn sqrt(x: f64) -> f64 {
    x.sqrt()
}

/// The natural logarithm (C's `log`), within 1 ulp. Written out (fdlibm's reduction and
/// polynomial, as musl's `log`) rather than calling libm so that it inlines without branches: the
/// CPU's dense-column loops then run it on four lanes at once, where a libm call per pair made
/// jensenshannon and kl_divergence 8-12x slower than cosine.
#[inline(always)]
pub fn log(x: f64) -> f64 {
    // Subnormals are scaled into the normal range first.
    let subnormal = x < f64::MIN_POSITIVE;
    let scaled = select(subnormal, x * 18_014_398_509_481_984.0, x); // 2^54
    let ln = log_of_normal(scaled, select(subnormal, 54.0, 0.0));
    // log(0) = -inf, log(+inf) = +inf, log(negative or NaN) = NaN, as C's.
    select(
        x > 0.0 && x < INF,
        ln,
        select(x == 0.0, -INF, select(x == INF, INF, f64::NAN)),
    )
}

/// `log` of an argument known to be positive, finite and normal, as `0.5·(x + y)` of two positive
/// float32 values always is: within 1 ulp of libm's `log` there, as `log` is, without its checks
/// for zero, infinity, NaN and subnormals, and with fdlibm's polynomial evaluated by fused
/// multiply-adds (jensenshannon's pair, once per posting: the CPU's pair loop is limited by the
/// count of floating-point operations, and fusing them is 18% faster on AVX-512). A fused
/// multiply-add is rounded once, as IEEE defines it, at every vector width (the baseline x86-64
/// build calls libm's `fma`), so the CPU's widths still give the same bits; they differ from
/// `log`'s in the last bit at times. Any other argument gives a meaningless number. Its CUDA twin
/// is CUDA's `log`.
#[inline(always)]
pub fn log_positive(x: f64) -> f64 {
    log_of_normal_fused(x)
}

/// fdlibm's constants for `log`, digit for digit.
#[allow(clippy::excessive_precision)]
mod fdlibm {
    pub(super) const LN2_HI: f64 = 6.931_471_803_691_238_164_90e-1;
    pub(super) const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;
    pub(super) const LG1: f64 = 6.666_666_666_666_735_130e-1;
    pub(super) const LG2: f64 = 3.999_999_999_940_941_908e-1;
    pub(super) const LG3: f64 = 2.857_142_874_366_239_149e-1;
    pub(super) const LG4: f64 = 2.222_219_843_214_978_396e-1;
    pub(super) const LG5: f64 = 1.818_357_216_161_805_012e-1;
    pub(super) const LG6: f64 = 1.531_383_769_920_937_332e-1;
    pub(super) const LG7: f64 = 1.479_819_860_511_658_591e-1;
}

/// fdlibm's reduction of a positive, finite, normal x = 2^k·m, m in [√½, √2): the exponent k as a
/// double, f = m − 1, hfsq = f²/2, s = f/(2 + f) and z = s², with ln m = f − hfsq + s·(hfsq + R(z)).
#[inline(always)]
fn reduce(x: f64) -> [f64; 5] {
    let bits = x.to_bits();
    // The mantissa in [√½, √2) and the matching exponent: adding 1 - √½ to the high bits carries
    // into the exponent exactly when the mantissa is at or above √2.
    let hx = (bits >> 32).wrapping_add(0x3ff0_0000 - 0x3fe6_a09e);
    let k_bits = (hx >> 20) & 0x7ff;
    let m_hi = (hx & 0x000f_ffff).wrapping_add(0x3fe6_a09e);
    let m = f64::from_bits((m_hi << 32) | (bits & 0xffff_ffff));
    // The exponent as a double without an integer conversion (which four-lane AVX2 lacks).
    let k = f64::from_bits(0x4330_0000_0000_0000 | k_bits) - 4_503_599_627_370_496.0 // 2^52
        - 1023.0;
    let f = m - 1.0;
    let hfsq = 0.5 * f * f;
    let s = f / (2.0 + f);
    [k, f, hfsq, s, s * s]
}

/// ln(x·2^-`scale`) for a positive, finite, normal x: fdlibm's reduction and polynomial.
#[inline(always)]
fn log_of_normal(x: f64, scale: f64) -> f64 {
    use fdlibm::*;
    let [k, f, hfsq, s, z] = reduce(x);
    let k = k - scale;
    let w = z * z;
    let t1 = w * (LG2 + w * (LG4 + w * LG6));
    let t2 = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)));
    let r = t2 + t1;
    s * (hfsq + r) + k * LN2_LO - hfsq + f + k * LN2_HI
}

/// [`log_of_normal`] (scale 0) with its multiply-adds fused: fdlibm's reduction, then
/// `R(z) = z·(Lg1 + z·(Lg2 + … + z·Lg7))` by Horner's rule, each step one `mul_add`, and
/// `k·ln2_lo` folded into `s·(hfsq + R) − hfsq`. Within 1 ulp of libm
/// (`log_positive_is_within_one_ulp_of_libm`).
#[inline(always)]
fn log_of_normal_fused(x: f64) -> f64 {
    use fdlibm::*;
    let [k, f, hfsq, s, z] = reduce(x);
    let p = z.mul_add(LG7, LG6);
    let p = z.mul_add(p, LG5);
    let p = z.mul_add(p, LG4);
    let p = z.mul_add(p, LG3);
    let p = z.mul_add(p, LG2);
    let p = z.mul_add(p, LG1);
    let r = z * p;
    s.mul_add(hfsq + r, k.mul_add(LN2_LO, -hfsq)) + f + k * LN2_HI
}

/// C's `pow`. The small integer powers (minkowski's usual p = 1..4) are products: within 2 ulps,
/// and a few cycles where libm's `pow` takes a hundred.
#[inline(always)]
pub fn pow(x: f64, y: f64) -> f64 {
    if y == 2.0 {
        x * x
    } else if y == 3.0 {
        x * x * x
    } else if y == 1.0 {
        x
    } else if y == 4.0 {
        let x2 = x * x;
        x2 * x2
    } else {
        x.powf(y)
    }
}

#[inline(always)]
pub fn fmax(x: f64, y: f64) -> f64 {
    x.max(y)
}

#[inline(always)]
pub fn fmin(x: f64, y: f64) -> f64 {
    x.min(y)
}

/// `x` limited to `[lo, hi]`.
#[inline(always)]
pub fn clamp(x: f64, lo: f64, hi: f64) -> f64 {
    fmin(fmax(x, lo), hi)
}

/// C's `c ? a : b`. Both sides are evaluated: formulas are pure, and a NaN or infinity in the
/// side not taken is dropped.
#[inline(always)]
pub fn select(c: bool, a: f64, b: f64) -> f64 {
    if c {
        a
    } else {
        b
    }
}

/// A folded sum `l + r + acc` that should be ≥ 0, where `scale = l + r`: a residue under 1e-13 of
/// the totals is 0. The sum over the shared columns cancels the totals up to rounding (about 1e-16
/// of them, in an order that the GPU's atomics choose); for an exact duplicate, minkowski's
/// p-th root would turn that residue into a visible distance (the cube root of 1e-12 is 1e-4).
#[inline(always)]
pub fn folded(sum: f64, scale: f64) -> f64 {
    select(sum <= 1e-13 * scale, 0.0, sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_is_within_one_ulp_of_libm() {
        let mut worst = 0u64;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut check = |x: f64| {
            let (ours, libm) = (log(x), x.ln());
            let ulps = (ours.to_bits() as i64 - libm.to_bits() as i64).unsigned_abs();
            assert!(ulps <= 1, "log({x:e}) = {ours:e}, libm {libm:e}");
            worst = worst.max(ulps);
        };
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Every exponent from subnormal to huge, every mantissa.
            let x = f64::from_bits(state >> 1);
            if x.is_finite() && x > 0.0 {
                check(x);
            }
            check(f32::from_bits((state >> 40) as u32 & 0x7f7f_ffff) as f64);
        }
        for x in [
            1.0,
            2.0,
            0.5,
            std::f64::consts::SQRT_2,
            1.0 + f64::EPSILON,
            1.0 - 1e-17,
        ] {
            check(x);
        }
        assert_eq!(log(1.0), 0.0);
        assert_eq!(log(0.0), -INF);
        assert_eq!(log(INF), INF);
        assert!(log(-1.0).is_nan() && log(f64::NAN).is_nan());
        assert!(log(f64::MIN_POSITIVE / 8.0).is_finite());
    }

    /// The fused logarithm against libm, and against the plain one (at most a last-bit apart)
    /// over positive normal arguments: every exponent, every mantissa, float32 sums as
    /// jensenshannon's pair forms them, and the reduction's edges.
    #[test]
    fn log_positive_is_within_one_ulp_of_libm() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut differ = 0usize;
        let mut check = |x: f64| {
            let (ours, libm, plain) = (log_positive(x), x.ln(), log(x));
            let ulps = |a: f64, b: f64| (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs();
            assert!(
                ulps(ours, libm) <= 1,
                "log_positive({x:e}) = {ours:e}, libm {libm:e}"
            );
            assert!(
                ulps(ours, plain) <= 1,
                "log_positive({x:e}) = {ours:e}, log {plain:e}"
            );
            differ += (ours != plain) as usize;
        };
        for _ in 0..300_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let x = f64::from_bits(state >> 1);
            if x.is_finite() && x >= f64::MIN_POSITIVE {
                check(x);
            }
            let (a, b) = ((state >> 40) as u32, (state >> 8) as u32);
            let (a, b) = (
                f32::from_bits(a & 0x7f7f_ffff),
                f32::from_bits(b & 0x7f7f_ffff),
            );
            if a > 0.0 && b > 0.0 {
                check(0.5 * (a as f64 + b as f64));
            }
            // Fractions of rows normalised to sum 1.
            check(0.5 * (a.fract() as f64 * 1e-3 + b.fract() as f64 * 1e-2) + 1e-9);
        }
        for x in [
            f64::MIN_POSITIVE,
            f64::MAX,
            1.0,
            2.0,
            0.5,
            std::f64::consts::SQRT_2,
            std::f64::consts::FRAC_1_SQRT_2,
            1.0 + f64::EPSILON,
            1.0 - f64::EPSILON / 2.0,
        ] {
            check(x);
        }
        assert_eq!(log_positive(1.0), 0.0);
        // Not the same function as `log`, bit for bit: the test would pass trivially otherwise.
        assert!(differ > 0);
    }

    #[test]
    fn integer_powers_are_within_two_ulps() {
        for x in [0.0, 1e-30, 0.37, 1.0, 3.5, 1234.5, 98_765.0, 1e30] {
            for p in [1.0, 2.0, 3.0, 4.0] {
                let (ours, libm) = (pow(x, p), f64::powf(x, p));
                let ulps = (ours.to_bits() as i64 - libm.to_bits() as i64).unsigned_abs();
                assert!(ulps <= 2, "pow({x}, {p}) = {ours:e}, libm {libm:e}");
            }
        }
        assert_eq!(pow(2.0, 0.5), 2f64.sqrt());
    }
}
