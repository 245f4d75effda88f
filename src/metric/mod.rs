//! The 16 metrics of the SPEC, each defined once ([`catalog`]) as a semiring that both backends
//! use: the CPU backend runs the definitions' Rust functions, the GPU backend compiles the CUDA
//! that [`cuda`] generates from the same formula text.
//!
//! Every metric except chebyshev is written in *folded* form: a per-row total for each side plus
//! a sum over the columns where both vectors are nonzero. For sum-reduced union (NAMM) metrics
//! this is exact, since `Σ_{X∪Y} f(x,y) = Σ_X f(x,0) + Σ_Y f(0,y) + Σ_{X∩Y} (f(x,y) - f(x,0) - f(0,y))`,
//! so the union semiring of the paper costs no more than a sparse dot product. Chebyshev (a max,
//! not a sum) needs the true union and has its own strategy in each backend.

mod catalog;
pub mod cuda;
pub mod define;
pub mod math;

pub use catalog::*;
pub use define::{KeyForm, Params, Reduction, RowTotals, Semiring, Source};

use std::fmt;
use std::str::FromStr;

use datafusion::common::{plan_err, DataFusionError, Result};

/// Runs `$body` with `$s` bound to the [`Semiring`] of `$metric` (a [`Metric`]): the one place
/// where a metric chosen at run time becomes a type, so the backends' loops are compiled per
/// metric.
#[macro_export]
macro_rules! with_semiring {
    ($metric:expr, $s:ident => $body:expr) => {{
        use $crate::metric as m;
        let metric: &m::Metric = &$metric;
        let prm = metric.params();
        match metric.kind {
            m::MetricKind::Dot => {
                let $s = m::Dot(prm);
                $body
            }
            m::MetricKind::Cosine => {
                let $s = m::Cosine(prm);
                $body
            }
            m::MetricKind::Euclidean => {
                let $s = m::Euclidean(prm);
                $body
            }
            m::MetricKind::SqEuclidean => {
                let $s = m::SqEuclidean(prm);
                $body
            }
            m::MetricKind::Manhattan => {
                let $s = m::Manhattan(prm);
                $body
            }
            m::MetricKind::Chebyshev => {
                let $s = m::Chebyshev(prm);
                $body
            }
            m::MetricKind::Minkowski => {
                let $s = m::Minkowski(prm);
                $body
            }
            m::MetricKind::Canberra => {
                let $s = m::Canberra(prm);
                $body
            }
            m::MetricKind::BrayCurtis => {
                let $s = m::BrayCurtis(prm);
                $body
            }
            m::MetricKind::Hamming => {
                let $s = m::Hamming(prm);
                $body
            }
            m::MetricKind::Jaccard => {
                let $s = m::Jaccard(prm);
                $body
            }
            m::MetricKind::Dice => {
                let $s = m::Dice(prm);
                $body
            }
            m::MetricKind::RussellRao => {
                let $s = m::RussellRao(prm);
                $body
            }
            m::MetricKind::Correlation => {
                let $s = m::Correlation(prm);
                $body
            }
            m::MetricKind::Hellinger => {
                let $s = m::Hellinger(prm);
                $body
            }
            m::MetricKind::JensenShannon => {
                let $s = m::JensenShannon(prm);
                $body
            }
            m::MetricKind::KlDivergence => {
                let $s = m::KlDivergence(prm);
                $body
            }
        }
    }};
}
pub use with_semiring;

/// Which metric, without its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricKind {
    Dot,
    Cosine,
    Euclidean,
    SqEuclidean,
    Manhattan,
    Chebyshev,
    Minkowski,
    Canberra,
    BrayCurtis,
    Hamming,
    Jaccard,
    Dice,
    RussellRao,
    Correlation,
    Hellinger,
    JensenShannon,
    KlDivergence,
}

/// Canonical names and aliases, as in the SPEC table (case-insensitive).
pub const METRIC_NAMES: &[(&str, MetricKind)] = &[
    ("dot", MetricKind::Dot),
    ("inner_product", MetricKind::Dot),
    ("ip", MetricKind::Dot),
    ("cosine", MetricKind::Cosine),
    ("euclidean", MetricKind::Euclidean),
    ("l2", MetricKind::Euclidean),
    ("sqeuclidean", MetricKind::SqEuclidean),
    ("manhattan", MetricKind::Manhattan),
    ("l1", MetricKind::Manhattan),
    ("cityblock", MetricKind::Manhattan),
    ("chebyshev", MetricKind::Chebyshev),
    ("linf", MetricKind::Chebyshev),
    ("minkowski", MetricKind::Minkowski),
    ("canberra", MetricKind::Canberra),
    ("braycurtis", MetricKind::BrayCurtis),
    ("hamming", MetricKind::Hamming),
    ("jaccard", MetricKind::Jaccard),
    ("dice", MetricKind::Dice),
    ("russellrao", MetricKind::RussellRao),
    ("correlation", MetricKind::Correlation),
    ("hellinger", MetricKind::Hellinger),
    ("jensenshannon", MetricKind::JensenShannon),
    ("js", MetricKind::JensenShannon),
    ("kl_divergence", MetricKind::KlDivergence),
    ("kl", MetricKind::KlDivergence),
];

impl MetricKind {
    pub fn name(self) -> &'static str {
        METRIC_NAMES
            .iter()
            .find(|(_, k)| *k == self)
            .map(|(n, _)| *n)
            .expect("every kind has a name")
    }

    pub fn all() -> impl Iterator<Item = MetricKind> {
        let mut seen = Vec::new();
        METRIC_NAMES.iter().filter_map(move |(_, k)| {
            if seen.contains(k) {
                return None;
            }
            seen.push(*k);
            Some(*k)
        })
    }

    /// hamming, russellrao and correlation are defined over all `d` coordinates.
    pub fn needs_dim(self) -> bool {
        matches!(
            self,
            MetricKind::Hamming | MetricKind::RussellRao | MetricKind::Correlation
        )
    }

    pub fn needs_nonnegative(self) -> bool {
        matches!(
            self,
            MetricKind::Hellinger | MetricKind::JensenShannon | MetricKind::KlDivergence
        )
    }

    /// `dot` is a similarity: the nearest neighbour has the largest value.
    pub fn is_similarity(self) -> bool {
        self == MetricKind::Dot
    }
}

impl FromStr for MetricKind {
    type Err = DataFusionError;

    fn from_str(s: &str) -> Result<Self> {
        let lower = s.trim().to_ascii_lowercase();
        match METRIC_NAMES.iter().find(|(n, _)| *n == lower) {
            Some((_, k)) => Ok(*k),
            None => plan_err!(
                "unknown metric '{s}'; valid metrics: {}",
                METRIC_NAMES
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

impl fmt::Display for MetricKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metric with its parameters, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metric {
    pub kind: MetricKind,
    /// Minkowski degree (≥ 1).
    pub p: f64,
    /// Dimension, for hamming, russellrao and correlation (and the index range check).
    pub dim: Option<u64>,
}

impl Metric {
    /// Parses a metric name and checks its parameters.
    pub fn new(name: &str, p: Option<f64>, dim: Option<u64>) -> Result<Self> {
        let kind: MetricKind = name.parse()?;
        Self::from_kind(kind, p, dim)
    }

    pub fn from_kind(kind: MetricKind, p: Option<f64>, dim: Option<u64>) -> Result<Self> {
        if kind.needs_dim() && dim.is_none() {
            return plan_err!(
                "metric '{kind}' needs the dimension: pass the option dim=<number of coordinates>"
            );
        }
        if dim == Some(0) {
            return plan_err!("option dim must be at least 1");
        }
        let p = p.unwrap_or(2.0);
        if kind == MetricKind::Minkowski && !(p.is_finite() && p >= 1.0) {
            return plan_err!("option p for minkowski must be a finite number >= 1, got {p}");
        }
        Ok(Self { kind, p, dim })
    }

    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// True if `a` is nearer than `b` (strictly).
    #[inline]
    pub fn nearer(&self, a: f64, b: f64) -> bool {
        if self.kind.is_similarity() {
            a > b
        } else {
            a < b
        }
    }

    /// Whether a pair at `distance` is inside `radius` (for `dot`: at least `radius`).
    #[inline]
    pub fn within(&self, distance: f64, radius: f64) -> bool {
        if self.kind.is_similarity() {
            distance >= radius
        } else {
            distance <= radius
        }
    }

    /// The parameters the formulas read (`prm.p`, `prm.d`).
    pub fn params(&self) -> Params {
        Params {
            p: self.p,
            d: self.dim.unwrap_or(1) as f64,
        }
    }

    /// The distance between two sparse rows (indices need not be sorted). Used row by row by
    /// `sparse_distance`; the join kernels compute the same semiring in bulk.
    pub fn distance(&self, a: (&[i32], &[f32]), b: (&[i32], &[f32])) -> f64 {
        with_semiring!(self, s => row_distance(&s, a, b))
    }
}

/// One pair of rows by a metric's definition: over the union with the exact term where the
/// definition has one (max-reduced metrics, and sum metrics whose folded form cancels), else by
/// the folded form over the intersection.
pub fn row_distance<S: Semiring>(s: &S, a: (&[i32], &[f32]), b: (&[i32], &[f32])) -> f64 {
    let a = sorted_nonzeros(a);
    let b = sorted_nonzeros(b);
    if s.has_exact_term() {
        return union_distance(s, &a, &b);
    }
    let ta = s.totals(a.iter().map(|e| e.1));
    let tb = s.totals(b.iter().map(|e| e.1));
    let (mut acc0, mut acc1) = (0.0, 0.0);
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].0.cmp(&b[j].0) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                let (c0, c1) = s.pair(a[i].1, b[j].1);
                acc0 += c0;
                acc1 += c1;
                i += 1;
                j += 1;
            }
        }
    }
    s.finish(acc0, acc1, &ta, &tb)
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            MetricKind::Minkowski => write!(f, "minkowski(p={})", self.p),
            k if k.needs_dim() => write!(f, "{k}(dim={})", self.dim.unwrap_or(0)),
            k => write!(f, "{k}"),
        }
    }
}

/// The distance by the exact term over the union of two rows given as their nonzero
/// `(index, value)` entries sorted by index (see [`sorted_nonzeros`]); for metrics with an
/// exact term.
///
/// A sum adds the columns of `a` alone, those of `b` alone and the shared ones as three sums
/// (each in column order), so that two rows with no column in common come to
/// `one_sided_sum(a, Left) + one_sided_sum(b, Right)` bit for bit: a join computes those once
/// per row and skips the walk for such pairs (see [`disjoint_distance`]).
pub fn union_distance<S: Semiring>(s: &S, a: &[(i32, f32)], b: &[(i32, f32)]) -> f64 {
    let zero = RowTotals::default();
    let reduced = match S::REDUCTION {
        Reduction::Sum => {
            let (mut only_a, mut only_b, mut shared) = (0.0, 0.0, 0.0);
            for (x, y) in union_pairs(a, b) {
                let t = s.term(x, y);
                if y == 0.0 {
                    only_a += t;
                } else if x == 0.0 {
                    only_b += t;
                } else {
                    shared += t;
                }
            }
            only_a + only_b + shared
        }
        Reduction::Max => union_pairs(a, b)
            .map(|(x, y)| s.term(x, y))
            .fold(0.0, f64::max),
    };
    s.finish(reduced, 0.0, &zero, &zero)
}

/// Which side of a pair a row is on (the exact term need not be symmetric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Left,
    Right,
}

/// A row's part of [`union_distance`] against a row it shares no column with: the sum of its
/// exact terms against zeros, in column order (`row` sorted as [`sorted_nonzeros`] gives it).
pub fn one_sided_sum<S: Semiring>(s: &S, row: &[(i32, f32)], side: Side) -> f64 {
    let terms = row.iter().map(|&(_, v)| match side {
        Side::Left => s.term(v as f64, 0.0),
        Side::Right => s.term(0.0, v as f64),
    });
    match S::REDUCTION {
        Reduction::Sum => terms.fold(0.0, |sum, t| sum + t),
        // (a max reduction: the largest term, as `union_distance` takes it)
        Reduction::Max => terms.fold(0.0, f64::max),
    }
}

/// [`union_distance`] of two rows that share no column, from their [`one_sided_sum`]s: the same
/// bits, without walking the rows (a sum metric).
pub fn disjoint_distance<S: Semiring>(s: &S, left_sum: f64, right_sum: f64) -> f64 {
    let zero = RowTotals::default();
    let reduced = match S::REDUCTION {
        Reduction::Sum => left_sum + right_sum + 0.0,
        Reduction::Max => left_sum.max(right_sum),
    };
    s.finish(reduced, 0.0, &zero, &zero)
}

/// Whether two rows sorted by index have a column in common.
pub fn share_a_column(a: &[(i32, f32)], b: &[(i32, f32)]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].0.cmp(&b[j].0) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => return true,
        }
    }
    false
}

/// A row's nonzero entries sorted by index (explicit zeros are not part of the support).
pub fn sorted_nonzeros(row: (&[i32], &[f32])) -> Vec<(i32, f32)> {
    let mut v = Vec::with_capacity(row.0.len());
    sorted_nonzeros_into(row, &mut v);
    v
}

/// [`sorted_nonzeros`] into a buffer the caller reuses (cleared first).
pub fn sorted_nonzeros_into((indices, values): (&[i32], &[f32]), out: &mut Vec<(i32, f32)>) {
    out.clear();
    out.extend(
        indices
            .iter()
            .zip(values)
            .filter(|(_, &x)| x != 0.0)
            .map(|(&i, &x)| (i, x)),
    );
    if !out.windows(2).all(|w| w[0].0 < w[1].0) {
        out.sort_unstable_by_key(|e| e.0);
    }
}

/// (x_i, y_i) over the union of two supports sorted by index (a missing side is 0).
fn union_pairs<'a>(
    a: &'a [(i32, f32)],
    b: &'a [(i32, f32)],
) -> impl Iterator<Item = (f64, f64)> + 'a {
    let (mut i, mut j) = (0, 0);
    std::iter::from_fn(move || {
        if j == b.len() || (i < a.len() && a[i].0 < b[j].0) {
            i += 1;
            a.get(i - 1).map(|e| (e.1 as f64, 0.0))
        } else if i == a.len() || b[j].0 < a[i].0 {
            j += 1;
            Some((0.0, b[j - 1].1 as f64))
        } else {
            i += 1;
            j += 1;
            Some((a[i - 1].1 as f64, b[j - 1].1 as f64))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows with no column in common: the one-sided sums give union_distance's own bits (the
    /// joins skip the walk for such candidates), for every metric with an exact term (the sums
    /// and chebyshev's max).
    #[test]
    fn disjoint_rows_take_their_distance_from_one_sided_sums() {
        let a: Vec<(i32, f32)> = (0..40)
            .map(|i| (2 * i, 1.0 + (i * 37 % 2900) as f32))
            .collect();
        let b: Vec<(i32, f32)> = (0..55)
            .map(|i| (2 * i + 1, 0.5 + (i * 53 % 3100) as f32))
            .collect();
        let mut shared = b.clone();
        shared[7].0 = a[3].0;
        shared.sort_unstable_by_key(|e| e.0);
        assert!(!share_a_column(&a, &b) && !share_a_column(&b, &a));
        assert!(share_a_column(&a, &shared) && share_a_column(&shared, &a));
        assert!(!share_a_column(&a, &[]));
        let mut checked = 0;
        for kind in MetricKind::all() {
            let metric = Metric::from_kind(kind, Some(3.0), Some(10_000)).unwrap();
            with_semiring!(metric, s => {
                if s.has_exact_term() {
                    checked += 1;
                    let want = union_distance(&s, &a, &b);
                    let got = disjoint_distance(
                        &s,
                        one_sided_sum(&s, &a, Side::Left),
                        one_sided_sum(&s, &b, Side::Right),
                    );
                    assert_eq!(want.to_bits(), got.to_bits(), "{kind}: {want} vs {got}");
                    // The same rows sharing a column are not disjoint: a different distance (a
                    // max is still the largest entry, elsewhere).
                    if reduction_of(&s) == Reduction::Sum {
                        assert_ne!(union_distance(&s, &a, &shared), want, "{kind}");
                    }
                }
            });
        }
        assert!(
            checked >= 4,
            "minkowski, hellinger, jensenshannon and chebyshev: {checked}"
        );
    }

    fn reduction_of<S: Semiring>(_: &S) -> Reduction {
        S::REDUCTION
    }
}
