//! Every metric of the SPEC, each defined once (see [`crate::semiring!`]); the CPU backend runs
//! these functions and the GPU backend compiles the CUDA generated from the same text.
//!
//! The CPU accumulates in f64; the GPU in 64-bit fixed point (exact, order-independent sums of
//! rounded terms); both finish in f64.

use crate::semiring;

semiring! {
    /// Σ xᵢyᵢ, a similarity.
    pub struct Dot = "dot";
    reduction: Sum;
    similarity: true;
    key: KeyForm::Negated;
    pair_vanishes: true;
    total(x, prm) = [0.0, 0.0];
    pair(x, y, prm) = { [x * y, 0.0] };
    finish(acc0, acc1, l, r, prm) = { acc0 };
}

semiring! {
    /// 1 − Σxy / (‖x‖‖y‖); a zero vector gives 1.
    pub struct Cosine = "cosine";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Quotient;
    pair_vanishes: true;
    total(x, prm) = [x * x, 0.0];
    pair(x, y, prm) = { [x * y, 0.0] };
    finish(acc0, acc1, l, r, prm) = {
        select(l.t0 == 0.0 || r.t0 == 0.0, 1.0, clamp(1.0 - acc0 / (sqrt(l.t0) * sqrt(r.t0)), 0.0, 2.0))
    };
}

semiring! {
    /// Σ(x − y)², expanded: ‖x‖² + ‖y‖² − 2Σxy.
    pub struct SqEuclidean = "sqeuclidean";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Shifted { scale: 1.0 };
    pair_vanishes: true;
    total(x, prm) = [x * x, 0.0];
    pair(x, y, prm) = { [-2.0 * x * y, 0.0] };
    finish(acc0, acc1, l, r, prm) = { fmax(l.t0 + r.t0 + acc0, 0.0) };
}

semiring! {
    /// √Σ(x − y)², expanded as sqeuclidean.
    pub struct Euclidean = "euclidean";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Shifted { scale: 1.0 };
    pair_vanishes: true;
    total(x, prm) = [x * x, 0.0];
    pair(x, y, prm) = { [-2.0 * x * y, 0.0] };
    finish(acc0, acc1, l, r, prm) = { sqrt(fmax(l.t0 + r.t0 + acc0, 0.0)) };
}

semiring! {
    /// Σ|x − y| (union, NAMM).
    pub struct Manhattan = "manhattan";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Shifted { scale: 1.0 };
    pair_vanishes: true;
    total(x, prm) = [fabs(x), 0.0];
    pair(x, y, prm) = { [fabs(x - y) - fabs(x) - fabs(y), 0.0] };
    finish(acc0, acc1, l, r, prm) = { fmax(l.t0 + r.t0 + acc0, 0.0) };
}

semiring! {
    /// (Σ|x − y|ᵖ)^(1/p). The folded form cancels for large, nearly equal values, so the exact
    /// term over the union is given too: the GPU sums it over the union, the CPU uses the folded
    /// form only to bound which rows can be nearest (src/cpu/certified.rs).
    pub struct Minkowski = "minkowski";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Shifted { scale: 1.0 };
    pair_vanishes: false;
    total(x, prm) = [pow(fabs(x), prm.p), 0.0];
    pair(x, y, prm) = {
        [pow(fabs(x - y), prm.p) - pow(fabs(x), prm.p) - pow(fabs(y), prm.p), 0.0]
    };
    finish(acc0, acc1, l, r, prm) = {
        pow(folded(l.t0 + r.t0 + acc0, l.t0 + r.t0), 1.0 / prm.p)
    };
    exact_term(x, y, prm) = pow(fabs(x - y), prm.p);
    finish_increasing: true;
}

semiring! {
    /// maxᵢ |x − y| over the union.
    pub struct Chebyshev = "chebyshev";
    reduction: Max;
    similarity: false;
    key: KeyForm::Exact;
    pair_vanishes: false;
    total(x, prm) = [0.0, 0.0];
    pair(x, y, prm) = { [fabs(x - y), 0.0] };
    finish(acc0, acc1, l, r, prm) = { acc0 };
    exact_term(x, y, prm) = fabs(x - y);
}

semiring! {
    /// Σ |x − y| / (|x| + |y|); a column nonzero on one side only contributes 1.
    pub struct Canberra = "canberra";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Shifted { scale: 1.0 };
    pair_vanishes: false;
    total(x, prm) = [1.0, 0.0];
    pair(x, y, prm) = { [fabs(x - y) / (fabs(x) + fabs(y)) - 2.0, 0.0] };
    finish(acc0, acc1, l, r, prm) = { fmax(l.t0 + r.t0 + acc0, 0.0) };
}

semiring! {
    /// Σ|x − y| / Σ|x + y|; 0 for two zero vectors.
    pub struct BrayCurtis = "braycurtis";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Exact;
    pair_vanishes: true;
    total(x, prm) = [fabs(x), 0.0];
    pair(x, y, prm) = {
        let base = fabs(x) + fabs(y);
        [fabs(x - y) - base, fabs(x + y) - base]
    };
    finish(acc0, acc1, l, r, prm) = {
        let num = fmax(l.t0 + r.t0 + acc0, 0.0);
        let den = fmax(l.t0 + r.t0 + acc1, 0.0);
        select(den == 0.0, select(num == 0.0, 0.0, INF), num / den)
    };
}

semiring! {
    /// #{i < d : xᵢ ≠ yᵢ} / d.
    pub struct Hamming = "hamming";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Shifted { scale: 1.0 };
    pair_vanishes: false;
    total(x, prm) = [1.0, 0.0];
    pair(x, y, prm) = { [select(x != y, -1.0, -2.0), 0.0] };
    finish(acc0, acc1, l, r, prm) = { fmax(l.t0 + r.t0 + acc0, 0.0) / prm.d };
}

semiring! {
    /// 1 − |X∩Y| / |X∪Y|; 0 when the union is empty.
    pub struct Jaccard = "jaccard";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Exact;
    pair_vanishes: false;
    total(x, prm) = [1.0, 0.0];
    pair(x, y, prm) = { [1.0, 0.0] };
    finish(acc0, acc1, l, r, prm) = {
        let uni = l.t0 + r.t0 - acc0;
        select(uni <= 0.0, 0.0, 1.0 - acc0 / uni)
    };
}

semiring! {
    /// 1 − 2|X∩Y| / (|X| + |Y|); 0 when both are empty.
    pub struct Dice = "dice";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Exact;
    pair_vanishes: false;
    total(x, prm) = [1.0, 0.0];
    pair(x, y, prm) = { [1.0, 0.0] };
    finish(acc0, acc1, l, r, prm) = {
        let total = l.t0 + r.t0;
        select(total <= 0.0, 0.0, 1.0 - 2.0 * acc0 / total)
    };
}

semiring! {
    /// (d − |X∩Y|) / d.
    pub struct RussellRao = "russellrao";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Negated;
    pair_vanishes: false;
    total(x, prm) = [0.0, 0.0];
    pair(x, y, prm) = { [1.0, 0.0] };
    finish(acc0, acc1, l, r, prm) = { (prm.d - acc0) / prm.d };
}

semiring! {
    /// 1 − Pearson correlation over all d coordinates; 1 when either vector is constant (zero
    /// included), where the variance is below 1e-12 of the sum of squares.
    pub struct Correlation = "correlation";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Exact;
    pair_vanishes: true;
    total(x, prm) = [x, x * x];
    pair(x, y, prm) = { [x * y, 0.0] };
    finish(acc0, acc1, l, r, prm) = {
        let var_l = l.t1 - l.t0 * l.t0 / prm.d;
        let var_r = r.t1 - r.t0 * r.t0 / prm.d;
        let cov = acc0 - l.t0 * r.t0 / prm.d;
        select(
            var_l <= 1e-12 * l.t1 || var_r <= 1e-12 * r.t1,
            1.0,
            clamp(1.0 - cov / (sqrt(var_l) * sqrt(var_r)), 0.0, 2.0)
        )
    };
}

semiring! {
    /// (1/√2)·√Σ(√x − √y)², folded: Σx + Σy − 2Σ√(xy). The square root makes the folded form's
    /// rounding (relative to Σx + Σy) show near 0 on large counts, so the union term is given.
    pub struct Hellinger = "hellinger";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Shifted { scale: 1.0 };
    pair_vanishes: true;
    total(x, prm) = [x, 0.0];
    lift(v, prm) = sqrt(v) => (sx, sy);
    pair(x, y, prm) = { [-2.0 * sx * sy, 0.0] };
    finish(acc0, acc1, l, r, prm) = {
        sqrt(fmax(l.t0 + r.t0 + acc0, 0.0)) / SQRT_2
    };
    exact_term(x, y, prm) = (sqrt(x) - sqrt(y)) * (sqrt(x) - sqrt(y));
    finish_increasing: true;
}

semiring! {
    /// √((Σ x ln(x/m) + Σ y ln(y/m)) / 2), m = (x + y)/2; a column nonzero on one side only
    /// contributes x·ln 2. As for hellinger, the square root of a folded sum near 0 needs the
    /// union term on large counts.
    pub struct JensenShannon = "jensenshannon";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Shifted { scale: 1.0 };
    pair_vanishes: false;
    total(x, prm) = [x * LN_2, 0.0];
    lift(v, prm) = log(v) => (lx, ly);
    pair(x, y, prm) = {
        // x, y > 0 (zeros are not stored; the dense pass drops the lanes where y = 0).
        let lm = log_positive(0.5 * (x + y));
        [x * (lx - lm) + y * (ly - lm) - (x + y) * LN_2, 0.0]
    };
    finish(acc0, acc1, l, r, prm) = {
        sqrt(fmax(0.5 * (l.t0 + r.t0 + acc0), 0.0))
    };
    exact_term(x, y, prm) = select(x > 0.0, x * log(2.0 * x / (x + y)), 0.0)
        + select(y > 0.0, y * log(2.0 * y / (x + y)), 0.0);
    finish_increasing: true;
}

semiring! {
    /// Σ_{x>0} x ln(x/y), x from the left side; +∞ unless every nonzero of the left row is
    /// shared (the second accumulator counts the shared columns).
    pub struct KlDivergence = "kl_divergence";
    reduction: Sum;
    similarity: false;
    key: KeyForm::Exact;
    pair_vanishes: false;
    total(x, prm) = [1.0, 0.0];
    lift(v, prm) = log(v) => (lx, ly);
    pair(x, y, prm) = { [x * (lx - ly), 1.0] };
    finish(acc0, acc1, l, r, prm) = { select(acc1 < l.t0, INF, acc0) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::math::LN_2;
    use crate::metric::{Params, Semiring};

    /// The lifted pairs are the textbook terms: checked in f64 on raw counts and small fractions.
    #[test]
    fn lifted_pairs_match_the_textbook_terms() {
        let values = [1e-6f32, 0.013, 0.5, 1.0, 2.0, 7.0, 1234.0, 65_000.0, 3.0e6];
        let prm = Params::default();
        for &x in &values {
            for &y in &values {
                let (xf, yf) = (x as f64, y as f64);
                let m = 0.5 * (xf + yf);
                let kl = xf * (xf / yf).ln();
                let js = xf * (xf / m).ln() + yf * (yf / m).ln() - (xf + yf) * LN_2;
                let he = -2.0 * (xf * yf).sqrt();
                // Each within a few ulps of the parts the certified bounds count (x|ln x| and
                // the like), never of the (possibly cancelled) term itself.
                let scale = (xf + yf) * (1.0 + xf.ln().abs() + yf.ln().abs() + m.ln().abs());
                let close = |ours: f64, want: f64, what: &str| {
                    assert!(
                        (ours - want).abs() <= 16.0 * f64::EPSILON * scale,
                        "{what}({x}, {y}) = {ours:e}, want {want:e}"
                    )
                };
                close(KlDivergence(prm).pair(x, y).0, kl, "kl");
                close(JensenShannon(prm).pair(x, y).0, js, "js");
                close(Hellinger(prm).pair(x, y).0, he, "hellinger");
                assert_eq!(KlDivergence(prm).pair(x, y).1, 1.0);
            }
        }
        const { assert!(KlDivergence::LIFTED && JensenShannon::LIFTED && Hellinger::LIFTED) };
        const { assert!(!Cosine::LIFTED && Cosine::ROUNDING_GROWTH == 1.0) };
    }
}
