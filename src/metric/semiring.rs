//! One zero-sized (or parameter-carrying) type per metric: row totals, the contribution of a
//! shared nonzero column, and the final expansion. The CPU kernels are generic over
//! [`Semiring`], so each metric gets its own compiled inner loop.

use std::f64::consts::{LN_2, SQRT_2};

/// Per-row totals over the row's nonzero values (what the folded form needs of each side).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RowTotals {
    pub t0: f64,
    pub t1: f64,
}

pub trait Semiring: Copy + Send + Sync + 'static {
    /// Whether `pair` produces a second accumulator (braycurtis, kl_divergence).
    const TWO_ACCUMULATORS: bool;

    /// Totals of one row from its values (zeros must already be skipped by the caller).
    fn totals(&self, values: impl IntoIterator<Item = f32>) -> RowTotals;

    /// Contribution of a column where both `x` (left) and `y` (right) are nonzero.
    fn pair(&self, x: f32, y: f32) -> (f64, f64);

    /// The distance from the accumulated sums and both rows' totals.
    fn finish(&self, acc0: f64, acc1: f64, left: &RowTotals, right: &RowTotals) -> f64;
}

/// Runs `$body` with `$s` bound to the semiring of `$metric` (a [`super::Metric`]).
/// Chebyshev has no folded form: callers take its own path before using this.
#[macro_export]
macro_rules! with_semiring {
    ($metric:expr, $s:ident => $body:expr) => {{
        use $crate::metric as m;
        let metric: &m::Metric = &$metric;
        match metric.kind {
            m::MetricKind::Dot => {
                let $s = m::Dot;
                $body
            }
            m::MetricKind::Cosine => {
                let $s = m::Cosine;
                $body
            }
            m::MetricKind::Euclidean => {
                let $s = m::Euclidean;
                $body
            }
            m::MetricKind::SqEuclidean => {
                let $s = m::SqEuclidean;
                $body
            }
            m::MetricKind::Manhattan => {
                let $s = m::Manhattan;
                $body
            }
            m::MetricKind::Minkowski => {
                let $s = m::Minkowski { p: metric.p };
                $body
            }
            m::MetricKind::Canberra => {
                let $s = m::Canberra;
                $body
            }
            m::MetricKind::BrayCurtis => {
                let $s = m::BrayCurtis;
                $body
            }
            m::MetricKind::Hamming => {
                let $s = m::Hamming {
                    d: metric.dim.unwrap_or(1) as f64,
                };
                $body
            }
            m::MetricKind::Jaccard => {
                let $s = m::Jaccard;
                $body
            }
            m::MetricKind::Dice => {
                let $s = m::Dice;
                $body
            }
            m::MetricKind::RussellRao => {
                let $s = m::RussellRao {
                    d: metric.dim.unwrap_or(1) as f64,
                };
                $body
            }
            m::MetricKind::Correlation => {
                let $s = m::Correlation {
                    d: metric.dim.unwrap_or(1) as f64,
                };
                $body
            }
            m::MetricKind::Hellinger => {
                let $s = m::Hellinger;
                $body
            }
            m::MetricKind::JensenShannon => {
                let $s = m::JensenShannon;
                $body
            }
            m::MetricKind::KlDivergence => {
                let $s = m::KlDivergence;
                $body
            }
            m::MetricKind::Chebyshev => unreachable!("chebyshev has no folded semiring"),
        }
    }};
}
pub use with_semiring;

fn sum(values: impl IntoIterator<Item = f32>, f: impl Fn(f64) -> f64) -> f64 {
    values.into_iter().map(|v| f(v as f64)).sum()
}

fn count(values: impl IntoIterator<Item = f32>) -> f64 {
    values.into_iter().count() as f64
}

macro_rules! unit_semiring {
    ($name:ident) => {
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $name;
    };
}

unit_semiring!(Dot);
impl Semiring for Dot {
    const TWO_ACCUMULATORS: bool = false;
    fn totals(&self, _: impl IntoIterator<Item = f32>) -> RowTotals {
        RowTotals::default()
    }
    #[inline(always)]
    fn pair(&self, x: f32, y: f32) -> (f64, f64) {
        (x as f64 * y as f64, 0.0)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, _: f64, _: &RowTotals, _: &RowTotals) -> f64 {
        acc0
    }
}

unit_semiring!(Cosine);
impl Semiring for Cosine {
    const TWO_ACCUMULATORS: bool = false;
    fn totals(&self, v: impl IntoIterator<Item = f32>) -> RowTotals {
        RowTotals {
            t0: sum(v, |x| x * x),
            t1: 0.0,
        }
    }
    #[inline(always)]
    fn pair(&self, x: f32, y: f32) -> (f64, f64) {
        (x as f64 * y as f64, 0.0)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, _: f64, a: &RowTotals, b: &RowTotals) -> f64 {
        if a.t0 == 0.0 || b.t0 == 0.0 {
            return 1.0;
        }
        (1.0 - acc0 / (a.t0.sqrt() * b.t0.sqrt())).clamp(0.0, 2.0)
    }
}

unit_semiring!(SqEuclidean);
impl Semiring for SqEuclidean {
    const TWO_ACCUMULATORS: bool = false;
    fn totals(&self, v: impl IntoIterator<Item = f32>) -> RowTotals {
        RowTotals {
            t0: sum(v, |x| x * x),
            t1: 0.0,
        }
    }
    #[inline(always)]
    fn pair(&self, x: f32, y: f32) -> (f64, f64) {
        (-2.0 * x as f64 * y as f64, 0.0)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, _: f64, a: &RowTotals, b: &RowTotals) -> f64 {
        (a.t0 + b.t0 + acc0).max(0.0)
    }
}

unit_semiring!(Euclidean);
impl Semiring for Euclidean {
    const TWO_ACCUMULATORS: bool = false;
    fn totals(&self, v: impl IntoIterator<Item = f32>) -> RowTotals {
        SqEuclidean.totals(v)
    }
    #[inline(always)]
    fn pair(&self, x: f32, y: f32) -> (f64, f64) {
        SqEuclidean.pair(x, y)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, acc1: f64, a: &RowTotals, b: &RowTotals) -> f64 {
        SqEuclidean.finish(acc0, acc1, a, b).sqrt()
    }
}

unit_semiring!(Manhattan);
impl Semiring for Manhattan {
    const TWO_ACCUMULATORS: bool = false;
    fn totals(&self, v: impl IntoIterator<Item = f32>) -> RowTotals {
        RowTotals {
            t0: sum(v, f64::abs),
            t1: 0.0,
        }
    }
    #[inline(always)]
    fn pair(&self, x: f32, y: f32) -> (f64, f64) {
        let (x, y) = (x as f64, y as f64);
        ((x - y).abs() - x.abs() - y.abs(), 0.0)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, _: f64, a: &RowTotals, b: &RowTotals) -> f64 {
        (a.t0 + b.t0 + acc0).max(0.0)
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Minkowski {
    pub p: f64,
}
impl Semiring for Minkowski {
    const TWO_ACCUMULATORS: bool = false;
    fn totals(&self, v: impl IntoIterator<Item = f32>) -> RowTotals {
        RowTotals {
            t0: sum(v, |x| x.abs().powf(self.p)),
            t1: 0.0,
        }
    }
    #[inline(always)]
    fn pair(&self, x: f32, y: f32) -> (f64, f64) {
        let (x, y) = (x as f64, y as f64);
        let p = self.p;
        (
            (x - y).abs().powf(p) - x.abs().powf(p) - y.abs().powf(p),
            0.0,
        )
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, _: f64, a: &RowTotals, b: &RowTotals) -> f64 {
        (a.t0 + b.t0 + acc0).max(0.0).powf(1.0 / self.p)
    }
}

unit_semiring!(Canberra);
impl Semiring for Canberra {
    const TWO_ACCUMULATORS: bool = false;
    fn totals(&self, v: impl IntoIterator<Item = f32>) -> RowTotals {
        // A column nonzero on one side only contributes |x| / |x| = 1.
        RowTotals {
            t0: count(v),
            t1: 0.0,
        }
    }
    #[inline(always)]
    fn pair(&self, x: f32, y: f32) -> (f64, f64) {
        let (x, y) = (x as f64, y as f64);
        ((x - y).abs() / (x.abs() + y.abs()) - 2.0, 0.0)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, _: f64, a: &RowTotals, b: &RowTotals) -> f64 {
        (a.t0 + b.t0 + acc0).max(0.0)
    }
}

unit_semiring!(BrayCurtis);
impl Semiring for BrayCurtis {
    const TWO_ACCUMULATORS: bool = true;
    fn totals(&self, v: impl IntoIterator<Item = f32>) -> RowTotals {
        RowTotals {
            t0: sum(v, f64::abs),
            t1: 0.0,
        }
    }
    #[inline(always)]
    fn pair(&self, x: f32, y: f32) -> (f64, f64) {
        let (x, y) = (x as f64, y as f64);
        let base = x.abs() + y.abs();
        ((x - y).abs() - base, (x + y).abs() - base)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, acc1: f64, a: &RowTotals, b: &RowTotals) -> f64 {
        let num = (a.t0 + b.t0 + acc0).max(0.0);
        let den = (a.t0 + b.t0 + acc1).max(0.0);
        if den == 0.0 {
            if num == 0.0 {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            num / den
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Hamming {
    pub d: f64,
}
impl Semiring for Hamming {
    const TWO_ACCUMULATORS: bool = false;
    fn totals(&self, v: impl IntoIterator<Item = f32>) -> RowTotals {
        RowTotals {
            t0: count(v),
            t1: 0.0,
        }
    }
    #[inline(always)]
    fn pair(&self, x: f32, y: f32) -> (f64, f64) {
        (if x != y { -1.0 } else { -2.0 }, 0.0)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, _: f64, a: &RowTotals, b: &RowTotals) -> f64 {
        (a.t0 + b.t0 + acc0).max(0.0) / self.d
    }
}

unit_semiring!(Jaccard);
impl Semiring for Jaccard {
    const TWO_ACCUMULATORS: bool = false;
    fn totals(&self, v: impl IntoIterator<Item = f32>) -> RowTotals {
        RowTotals {
            t0: count(v),
            t1: 0.0,
        }
    }
    #[inline(always)]
    fn pair(&self, _: f32, _: f32) -> (f64, f64) {
        (1.0, 0.0)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, _: f64, a: &RowTotals, b: &RowTotals) -> f64 {
        let union = a.t0 + b.t0 - acc0;
        if union <= 0.0 {
            0.0
        } else {
            1.0 - acc0 / union
        }
    }
}

unit_semiring!(Dice);
impl Semiring for Dice {
    const TWO_ACCUMULATORS: bool = false;
    fn totals(&self, v: impl IntoIterator<Item = f32>) -> RowTotals {
        RowTotals {
            t0: count(v),
            t1: 0.0,
        }
    }
    #[inline(always)]
    fn pair(&self, _: f32, _: f32) -> (f64, f64) {
        (1.0, 0.0)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, _: f64, a: &RowTotals, b: &RowTotals) -> f64 {
        let total = a.t0 + b.t0;
        if total <= 0.0 {
            0.0
        } else {
            1.0 - 2.0 * acc0 / total
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct RussellRao {
    pub d: f64,
}
impl Semiring for RussellRao {
    const TWO_ACCUMULATORS: bool = false;
    fn totals(&self, _: impl IntoIterator<Item = f32>) -> RowTotals {
        RowTotals::default()
    }
    #[inline(always)]
    fn pair(&self, _: f32, _: f32) -> (f64, f64) {
        (1.0, 0.0)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, _: f64, _: &RowTotals, _: &RowTotals) -> f64 {
        (self.d - acc0) / self.d
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Correlation {
    pub d: f64,
}
impl Semiring for Correlation {
    const TWO_ACCUMULATORS: bool = false;
    fn totals(&self, v: impl IntoIterator<Item = f32>) -> RowTotals {
        let (mut s, mut s2) = (0.0, 0.0);
        for x in v {
            let x = x as f64;
            s += x;
            s2 += x * x;
        }
        RowTotals { t0: s, t1: s2 }
    }
    #[inline(always)]
    fn pair(&self, x: f32, y: f32) -> (f64, f64) {
        (x as f64 * y as f64, 0.0)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, _: f64, a: &RowTotals, b: &RowTotals) -> f64 {
        let d = self.d;
        let var_a = a.t1 - a.t0 * a.t0 / d;
        let var_b = b.t1 - b.t0 * b.t0 / d;
        // A constant vector (all coordinates equal, zero included) has no correlation: 1.
        const CONSTANT: f64 = 1e-12;
        if var_a <= CONSTANT * a.t1 || var_b <= CONSTANT * b.t1 {
            return 1.0;
        }
        let cov = acc0 - a.t0 * b.t0 / d;
        (1.0 - cov / (var_a.sqrt() * var_b.sqrt())).clamp(0.0, 2.0)
    }
}

unit_semiring!(Hellinger);
impl Semiring for Hellinger {
    const TWO_ACCUMULATORS: bool = false;
    fn totals(&self, v: impl IntoIterator<Item = f32>) -> RowTotals {
        RowTotals {
            t0: sum(v, |x| x),
            t1: 0.0,
        }
    }
    #[inline(always)]
    fn pair(&self, x: f32, y: f32) -> (f64, f64) {
        (-2.0 * (x as f64 * y as f64).sqrt(), 0.0)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, _: f64, a: &RowTotals, b: &RowTotals) -> f64 {
        (a.t0 + b.t0 + acc0).max(0.0).sqrt() / SQRT_2
    }
}

unit_semiring!(JensenShannon);
impl Semiring for JensenShannon {
    const TWO_ACCUMULATORS: bool = false;
    fn totals(&self, v: impl IntoIterator<Item = f32>) -> RowTotals {
        // A column nonzero on one side only contributes x·ln(x / (x/2)) = x·ln 2.
        RowTotals {
            t0: sum(v, |x| x),
            t1: 0.0,
        }
    }
    #[inline(always)]
    fn pair(&self, x: f32, y: f32) -> (f64, f64) {
        let (x, y) = (x as f64, y as f64);
        let m = 0.5 * (x + y);
        (x * (x / m).ln() + y * (y / m).ln() - (x + y) * LN_2, 0.0)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, _: f64, a: &RowTotals, b: &RowTotals) -> f64 {
        (0.5 * ((a.t0 + b.t0) * LN_2 + acc0)).max(0.0).sqrt()
    }
}

unit_semiring!(KlDivergence);
impl Semiring for KlDivergence {
    const TWO_ACCUMULATORS: bool = true;
    fn totals(&self, v: impl IntoIterator<Item = f32>) -> RowTotals {
        RowTotals {
            t0: count(v),
            t1: 0.0,
        }
    }
    #[inline(always)]
    fn pair(&self, x: f32, y: f32) -> (f64, f64) {
        let (x, y) = (x as f64, y as f64);
        (x * (x / y).ln(), 1.0)
    }
    #[inline(always)]
    fn finish(&self, acc0: f64, acc1: f64, a: &RowTotals, _: &RowTotals) -> f64 {
        // Some x > 0 has y = 0 unless every nonzero of the left row is shared.
        if acc1 < a.t0 {
            f64::INFINITY
        } else {
            acc0
        }
    }
}
