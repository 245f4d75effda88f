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

/// The natural logarithm (C's `log`).
#[inline(always)]
pub fn log(x: f64) -> f64 {
    x.ln()
}

#[inline(always)]
pub fn pow(x: f64, y: f64) -> f64 {
    x.powf(y)
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
