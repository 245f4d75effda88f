//! What a metric is: the [`Semiring`] trait, and [`crate::semiring!`], which turns one written
//! definition into both the Rust functions the CPU backend runs and the text of the CUDA
//! functions the GPU backend compiles (see [`super::cuda`]).
//!
//! A definition gives, once:
//! - `total(x)`: the two per-row totals, as sums of a term per nonzero value;
//! - `pair(x, y)`: the contribution of a column where both rows are nonzero, to one or two
//!   accumulators (the folded form: `Σ_{X∪Y} f = Σ_X f(x,0) + Σ_Y f(0,y) + Σ_{X∩Y} (f(x,y) −
//!   f(x,0) − f(0,y))`, so a union (NAMM) metric costs no more than a dot product);
//! - `finish(acc0, acc1, l, r)`: the distance from the accumulators and both rows' totals;
//! - optionally `lift(v) = ... => (lx, ly)`: a per-value quantity (a logarithm, a square root)
//!   that `pair` reads as `lx` (of x) and `ly` (of y). The CPU computes it once per stored right
//!   value and once per left value instead of once per pair: kl_divergence's `x·(ln x − ln y)` is
//!   then a multiply-add where `x·ln(x/y)` was a division and a logarithm per shared column. The
//!   GPU computes it in place. The CPU's dense columns hold zeros too, with the lift of 0 beside
//!   them: a pair that vanishes (`pair_vanishes: true`) must vanish given that lift as well;
//! - optionally `exact_term(x, y)`: the full term over the union, for metrics whose folded form
//!   cancels badly (minkowski) and for max-reduced metrics (chebyshev), whose `finish` is then
//!   applied to `Σ term` (or `max term`) with zero totals. Both backends compute such a metric
//!   over the union of the two rows, never from the folded form alone;
//! - how the backends may select and skip: its [`KeyForm`], whether `pair(x, 0)` vanishes,
//!   whether it is a similarity (nearest = largest).
//!
//! The GPU accumulates pair terms in 64-bit fixed point scaled by a bound on the terms (see
//! `kernels/knn.cu`): a definition's pair terms must be monotone in |y| for each sign of y, or
//! reach their largest magnitude at y = ±x; the kernels flag a term beyond the bound.
//!
//! Formulas are written in the shared vocabulary of [`super::math`] (`fabs`, `sqrt`, `log`, `pow`,
//! `select`, `clamp`, `folded`, `INF`, `LN_2`, ...), which is valid Rust and valid CUDA C alike.

/// Per-row totals over the row's nonzero values (what the folded form needs of each side). The
/// CUDA prelude has the same struct, so formulas read `l.t0` / `r.t1` in both languages.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RowTotals {
    pub t0: f64,
    pub t1: f64,
}

/// A metric's parameters, read by formulas as `prm.p` and `prm.d`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Minkowski degree.
    pub p: f64,
    /// The dimension (hamming, russellrao, correlation); 1 when not given.
    pub d: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params { p: 2.0, d: 1.0 }
    }
}

/// How a metric reduces the per-column terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// A sum, evaluated in folded form (totals + a sum over shared columns).
    Sum,
    /// A max over the union of columns (chebyshev), of `exact_term`. Its strategies also rely on
    /// `exact_term(x, 0) = |x|` and `exact_term(0, y) = |y|`: a left-only (right-only) column's
    /// term grows with the value's magnitude, so the largest one is found first by sorting.
    Max,
}

/// How a backend ranks right rows cheaply before finishing them: a *filter* value per right row,
/// computed from the accumulated sum and a per-row constant (`base`), of which the metric's
/// `finish` is a non-decreasing function (a sqrt, a clamp, a division by d, ...). A row whose
/// filter is not below that of the current k-th row cannot beat it, so most rows are never
/// finished. Checked on real pairs by a test in `src/cpu/tests.rs`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyForm {
    /// −acc: dot (a similarity), russellrao ((d − acc) / d).
    Negated,
    /// −acc / (‖x‖·‖y‖), base = ‖y‖ = √t0 (0 for a zero row, whose distance is 1 as for
    /// acc = 0): cosine.
    Quotient,
    /// (left + base)·scale + acc, base the right row's t0: distances g(l.t0 + r.t0 + acc).
    Shifted { scale: f64 },
    /// The distance itself.
    Exact,
}

impl KeyForm {
    /// The per right row constant: the same double the metric's `finish` computes from the totals.
    pub fn base(self, totals: &RowTotals) -> f64 {
        match self {
            KeyForm::Negated | KeyForm::Exact => 0.0,
            KeyForm::Quotient => totals.t0.sqrt(),
            KeyForm::Shifted { .. } => totals.t0,
        }
    }

    /// CUDA C for the filter: `(value, at_least)`, over `acc`, the left row's `l_total` (t0) and
    /// `l_norm` (√t0), the right row's `base`, and for `at_least` a bound `F`. `value` is the
    /// CPU's `filter_value` (src/cpu/folded.rs), the same doubles, each operation rounded on its
    /// own (no fused multiply-add), so the GPU's filter orders rows as the `finish` it guards
    /// does. `at_least` is true only where `value >= F`, without a division: for a quotient
    /// −acc/p (p = l_norm·base > 0), a fused F·p + acc below 0 means acc/p < −F, and −F is a
    /// double, so the rounded quotient is at most −F. None for [`KeyForm::Exact`].
    pub fn cuda_filter(self) -> Option<(String, String)> {
        let exact = |value: &str| (value.to_string(), format!("({value}) >= F"));
        match self {
            KeyForm::Negated => Some(exact("-acc")),
            KeyForm::Quotient => Some((
                "(base == 0.0 || l_norm == 0.0) ? 0.0 : -(acc / __dmul_rn(l_norm, base))".into(),
                "(base == 0.0 || l_norm == 0.0) ? 0.0 >= F \
                 : fma(F, __dmul_rn(l_norm, base), acc) < 0.0"
                    .into(),
            )),
            KeyForm::Shifted { scale } => Some(exact(&format!(
                "__dadd_rn(__dmul_rn(__dadd_rn(l_total, base), {scale:?}), acc)"
            ))),
            KeyForm::Exact => None,
        }
    }
}

/// The formula texts of a definition, as written (for the CUDA generator).
#[derive(Debug, Clone, Copy)]
pub struct Source {
    /// Names bound by `total`: the value and the parameters.
    pub total_names: [&'static str; 2],
    pub total: [&'static str; 2],
    /// Names bound by `pair`: x, y and the parameters; `let` bindings; the two terms.
    pub pair_names: [&'static str; 3],
    pub pair_lets: &'static [(&'static str, &'static str)],
    pub pair: [&'static str; 2],
    /// Names bound by `finish`: acc0, acc1, left totals, right totals, parameters.
    pub finish_names: [&'static str; 5],
    pub finish_lets: &'static [(&'static str, &'static str)],
    pub finish: &'static str,
    /// `exact_term`: names (x, y, parameters) and the term.
    pub exact_term: Option<([&'static str; 3], &'static str)>,
    /// `lift`: names (value, parameters), the formula, and the names `pair` reads it by (x's, y's).
    pub lift: Option<([&'static str; 2], &'static str, [&'static str; 2])>,
}

/// A metric, defined once (by [`crate::semiring!`]) for both backends. The backends are generic
/// over it, so each metric gets its own compiled CPU loop and its own CUDA module.
pub trait Semiring: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// The canonical name (kernel and module names, EXPLAIN).
    const NAME: &'static str;
    const REDUCTION: Reduction;
    /// A similarity: the nearest neighbour has the largest value (dot).
    const SIMILARITY: bool;
    const KEY: KeyForm;
    /// `pair(x, 0)` is exactly 0 and cheap, so a dense column (zeros where a right row lacks it)
    /// can be added without testing each value. Otherwise zeros are skipped: the pair assumes both
    /// sides nonzero (canberra, the set metrics, kl, js) or is costly (pow).
    const PAIR_VANISHES: bool;
    /// `pair` feeds a second accumulator (its second term is not the literal 0).
    const TWO_ACCUMULATORS: bool;
    /// `pair` reads a per-value `lift` (see the module docs).
    const LIFTED: bool;
    const SOURCE: Source;
    /// A sum metric whose `finish(s, 0, zero totals, zero totals)` never decreases as `s` grows
    /// (up to a pow's last-bit rounding), declared by `finish_increasing: true;`: the distance of
    /// two rows that share no column then grows with their one-sided sums, so a row's nearest
    /// such rows are found among the right rows of smallest one-sided sum
    /// (the join core's `ExactRows`) instead of being bounded by the kernels.
    const FINISH_INCREASING: bool;

    /// How much larger than a few ulps of `|acc| + 2(L + R)` the rounding of the folded sum may be,
    /// for the certified bounds (src/cpu/certified.rs, `kernels/knn.cu`). A lifted pair subtracts
    /// lifted values, e.g. jensenshannon's `x·(ln x − ln m)`, each term rounded relative to
    /// `x·|ln x|` rather than to the `x·ln 2` of the totals; |ln v| ≤ 104 for any float32 v, so
    /// 256 covers it.
    const ROUNDING_GROWTH: f64 = if Self::LIFTED { 256.0 } else { 1.0 };

    fn params(&self) -> Params;
    fn total0(x: f64, prm: &Params) -> f64;
    fn total1(x: f64, prm: &Params) -> f64;
    /// The lift of one value (0 where the definition has none).
    fn lift_raw(v: f64, prm: &Params) -> f64;
    /// The pair terms, given x, y and their lifts.
    fn pair0(x: f64, y: f64, lift_x: f64, lift_y: f64, prm: &Params) -> f64;
    fn pair1(x: f64, y: f64, lift_x: f64, lift_y: f64, prm: &Params) -> f64;
    fn finish_raw(acc0: f64, acc1: f64, l: &RowTotals, r: &RowTotals, prm: &Params) -> f64;
    /// The full per-column term over the union (see the module docs); None where not defined.
    fn exact_term(x: f64, y: f64, prm: &Params) -> Option<f64>;

    /// Totals of one row from its values (zeros must already be skipped by the caller).
    #[inline(always)]
    fn totals(&self, values: impl IntoIterator<Item = f32>) -> RowTotals {
        let prm = self.params();
        let mut t = RowTotals::default();
        for v in values {
            t.t0 += Self::total0(v as f64, &prm);
            t.t1 += Self::total1(v as f64, &prm);
        }
        t
    }

    /// Contribution of a column where both `x` (left) and `y` (right) are nonzero.
    #[inline(always)]
    fn pair(&self, x: f32, y: f32) -> (f64, f64) {
        self.pair_lifted(x, self.lift(x), y, self.lift(y))
    }

    /// The lift of a value, as `pair_lifted` takes it.
    #[inline(always)]
    fn lift(&self, v: f32) -> f64 {
        if Self::LIFTED {
            Self::lift_raw(v as f64, &self.params())
        } else {
            0.0
        }
    }

    /// [`Semiring::pair`] with the lifts already computed (by [`Semiring::lift`]).
    #[inline(always)]
    fn pair_lifted(&self, x: f32, lift_x: f64, y: f32, lift_y: f64) -> (f64, f64) {
        let prm = self.params();
        let (x, y) = (x as f64, y as f64);
        let a = Self::pair0(x, y, lift_x, lift_y, &prm);
        let b = if Self::TWO_ACCUMULATORS {
            Self::pair1(x, y, lift_x, lift_y, &prm)
        } else {
            0.0
        };
        (a, b)
    }

    /// The distance from the accumulated sums and both rows' totals.
    #[inline(always)]
    fn finish(&self, acc0: f64, acc1: f64, left: &RowTotals, right: &RowTotals) -> f64 {
        Self::finish_raw(acc0, acc1, left, right, &self.params())
    }

    /// `exact_term(x, y)` for these parameters. Panics where the definition has none: callers
    /// check [`Semiring::has_exact_term`] (a definition error, not a data error).
    #[inline(always)]
    fn term(&self, x: f64, y: f64) -> f64 {
        Self::exact_term(x, y, &self.params())
            .unwrap_or_else(|| panic!("metric {} has no exact_term", Self::NAME))
    }

    fn has_exact_term(&self) -> bool {
        Self::SOURCE.exact_term.is_some()
    }

    /// `c` where the pair term is `c·x·y` for one constant c (one accumulator, no lift),
    /// checked on values of both signs and several magnitudes where the products are exact in
    /// f64, so a term that is not bilinear (|x|·y, x·y², a select on a sign) shows; None
    /// otherwise.
    fn pair_scale(&self) -> Option<f64> {
        if Self::TWO_ACCUMULATORS || Self::LIFTED {
            return None;
        }
        let prm = self.params();
        let c = Self::pair0(1.0, 1.0, 0.0, 0.0, &prm);
        let points = [
            (2.0, 3.0),
            (-1.5, 4.0),
            (0.25, -8.0),
            (-3.0, -5.0),
            (1024.0, 7.0),
            (0.5, 0.5),
        ];
        let bilinear = c.is_finite()
            && c != 0.0
            && points
                .iter()
                .all(|&(x, y)| Self::pair0(x, y, 0.0, 0.0, &prm) == c * x * y);
        bilinear.then_some(c)
    }
}

/// Whether a formula text is the literal zero (so a term can be left out).
pub const fn is_zero_literal(text: &str) -> bool {
    let b = text.as_bytes();
    matches!(b, b"0.0" | b"0" | b"0." | b"0.0f64")
}

/// Defines a metric once for both backends. See [`super::catalog`] for every metric of the SPEC
/// and `tests/it/custom_metric.rs` for one defined outside the crate.
///
/// The formulas bind the names given in the heads (`total(x, prm)`, ...) and may use `let`
/// bindings before the final expression; all arithmetic is in f64, with the functions of
/// [`crate::metric::math`].
#[macro_export]
macro_rules! semiring {
    (
        $(#[$doc:meta])*
        $vis:vis struct $name:ident = $metric_name:literal;
        reduction: $reduction:ident;
        similarity: $similarity:literal;
        key: $key:expr;
        pair_vanishes: $vanishes:literal;
        total($tx:ident, $tprm:ident) = [$t0:expr, $t1:expr];
        $(lift($lv:ident, $lprm:ident) = $lift:expr => ($lx:ident, $ly:ident);)?
        pair($px:ident, $py:ident, $pprm:ident) = {
            $(let $plet:ident = $plet_e:expr;)* [$p0:expr, $p1:expr]
        };
        finish($acc0:ident, $acc1:ident, $fl:ident, $fr:ident, $fprm:ident) = {
            $(let $flet:ident = $flet_e:expr;)* $fin:expr
        };
        $(exact_term($ex:ident, $ey:ident, $eprm:ident) = $eterm:expr;)?
        $(finish_increasing: $increasing:literal;)?
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq)]
        $vis struct $name(pub $crate::metric::Params);

        #[allow(unused_variables, unused_imports, clippy::neg_multiply, clippy::eq_op)]
        impl $crate::metric::Semiring for $name {
            const NAME: &'static str = $metric_name;
            const REDUCTION: $crate::metric::Reduction = $crate::metric::Reduction::$reduction;
            const SIMILARITY: bool = $similarity;
            const KEY: $crate::metric::KeyForm = {
                use $crate::metric::math::*;
                use $crate::metric::KeyForm;
                $key
            };
            const PAIR_VANISHES: bool = $vanishes;
            const TWO_ACCUMULATORS: bool =
                !$crate::metric::define::is_zero_literal(stringify!($p1));
            const LIFTED: bool = $crate::semiring!(@lifted $($lift)?);
            const FINISH_INCREASING: bool = $crate::semiring!(@flag $($increasing)?);
            const SOURCE: $crate::metric::Source = $crate::metric::Source {
                total_names: [stringify!($tx), stringify!($tprm)],
                total: [stringify!($t0), stringify!($t1)],
                pair_names: [stringify!($px), stringify!($py), stringify!($pprm)],
                pair_lets: &[$((stringify!($plet), stringify!($plet_e))),*],
                pair: [stringify!($p0), stringify!($p1)],
                finish_names: [
                    stringify!($acc0),
                    stringify!($acc1),
                    stringify!($fl),
                    stringify!($fr),
                    stringify!($fprm),
                ],
                finish_lets: &[$((stringify!($flet), stringify!($flet_e))),*],
                finish: stringify!($fin),
                exact_term: $crate::semiring!(@term $([stringify!($ex), stringify!($ey), stringify!($eprm)], stringify!($eterm))?),
                lift: $crate::semiring!(@lift_source $([stringify!($lv), stringify!($lprm)], stringify!($lift), [stringify!($lx), stringify!($ly)])?),
            };

            #[inline(always)]
            fn params(&self) -> $crate::metric::Params {
                self.0
            }
            #[inline(always)]
            fn total0($tx: f64, $tprm: &$crate::metric::Params) -> f64 {
                use $crate::metric::math::*;
                $t0
            }
            #[inline(always)]
            fn total1($tx: f64, $tprm: &$crate::metric::Params) -> f64 {
                use $crate::metric::math::*;
                $t1
            }
            #[inline(always)]
            fn lift_raw(v: f64, prm: &$crate::metric::Params) -> f64 {
                $crate::semiring!(@eval_lift v, prm $(; $lv, $lprm, $lift)?)
            }
            #[inline(always)]
            fn pair0(
                $px: f64,
                $py: f64,
                lift_x: f64,
                lift_y: f64,
                $pprm: &$crate::metric::Params,
            ) -> f64 {
                use $crate::metric::math::*;
                $(let ($lx, $ly) = (lift_x, lift_y);)?
                $(let $plet: f64 = $plet_e;)*
                $p0
            }
            #[inline(always)]
            fn pair1(
                $px: f64,
                $py: f64,
                lift_x: f64,
                lift_y: f64,
                $pprm: &$crate::metric::Params,
            ) -> f64 {
                use $crate::metric::math::*;
                $(let ($lx, $ly) = (lift_x, lift_y);)?
                $(let $plet: f64 = $plet_e;)*
                $p1
            }
            #[inline(always)]
            fn finish_raw(
                $acc0: f64,
                $acc1: f64,
                $fl: &$crate::metric::RowTotals,
                $fr: &$crate::metric::RowTotals,
                $fprm: &$crate::metric::Params,
            ) -> f64 {
                use $crate::metric::math::*;
                $(let $flet: f64 = $flet_e;)*
                $fin
            }
            #[inline(always)]
            fn exact_term(x: f64, y: f64, prm: &$crate::metric::Params) -> Option<f64> {
                $crate::semiring!(@eval_term x, y, prm $(; $ex, $ey, $eprm, $eterm)?)
            }
        }
    };
    (@term) => { None };
    (@lifted) => { false };
    (@flag) => { false };
    (@flag $value:literal) => { $value };
    (@lifted $lift:expr) => { true };
    (@lift_source) => { None };
    (@lift_source $names:expr, $text:expr, $reads:expr) => { Some(($names, $text, $reads)) };
    (@eval_lift $v:ident, $prm:ident) => {{
        let _ = ($v, $prm);
        0.0
    }};
    (@eval_lift $v:ident, $prm:ident; $lv:ident, $lprm:ident, $lift:expr) => {{
        use $crate::metric::math::*;
        let ($lv, $lprm) = ($v, $prm);
        $lift
    }};
    (@term $names:expr, $text:expr) => { Some(($names, $text)) };
    (@eval_term $x:ident, $y:ident, $prm:ident) => {{
        let _ = ($x, $y, $prm);
        None
    }};
    (@eval_term $x:ident, $y:ident, $prm:ident; $ex:ident, $ey:ident, $eprm:ident, $eterm:expr) => {{
        use $crate::metric::math::*;
        let ($ex, $ey, $eprm) = ($x, $y, $prm);
        Some($eterm)
    }};
}
