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
