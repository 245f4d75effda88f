// The 16 metrics of src/metric/semiring.rs in CUDA C: the same folded form (per-row totals, a sum
// over columns where both rows are nonzero, then `finish`). Keep the two files in step: the GPU
// tests compare every metric against the CPU backend, which uses the Rust definitions.
//
// Metric ids follow `MetricKind` in src/gpu/kernels.rs (metric_id).


#define M_DOT 0
#define M_COSINE 1
#define M_EUCLIDEAN 2
#define M_SQEUCLIDEAN 3
#define M_MANHATTAN 4
#define M_CHEBYSHEV 5
#define M_MINKOWSKI 6
#define M_CANBERRA 7
#define M_BRAYCURTIS 8
#define M_HAMMING 9
#define M_JACCARD 10
#define M_DICE 11
#define M_RUSSELLRAO 12
#define M_CORRELATION 13
#define M_HELLINGER 14
#define M_JENSENSHANNON 15
#define M_KL 16

#define SQRT_2 1.4142135623730951
#define LN_2 0.6931471805599453

// Whether `pair` produces a second accumulator.
template <int K> __device__ __forceinline__ constexpr bool two_acc() {
    return K == M_BRAYCURTIS || K == M_KL;
}

// Whether `finish` reads the right row's totals (t0 / t1): the finish pass streams them for every
// (left row, right row) pair, so metrics that need none skip the loads.
template <int K> __device__ __forceinline__ constexpr bool needs_rt0() {
    return !(K == M_DOT || K == M_RUSSELLRAO || K == M_KL);
}
template <int K> __device__ __forceinline__ constexpr bool needs_rt1() {
    return K == M_CORRELATION;
}

// Contribution of one row value to that row's totals (t0, t1).
template <int K> __device__ __forceinline__ void total_term(double x, double p, double& t0, double& t1) {
    switch (K) {
    case M_COSINE:
    case M_EUCLIDEAN:
    case M_SQEUCLIDEAN: t0 += x * x; break;
    case M_MANHATTAN:
    case M_BRAYCURTIS: t0 += fabs(x); break;
    case M_MINKOWSKI: t0 += pow(fabs(x), p); break;
    case M_CANBERRA:
    case M_HAMMING:
    case M_JACCARD:
    case M_DICE:
    case M_KL: t0 += 1.0; break;
    case M_CORRELATION: t0 += x; t1 += x * x; break;
    case M_HELLINGER:
    case M_JENSENSHANNON: t0 += x; break;
    default: break;
    }
}

// Contribution of a column where both x (left) and y (right) are nonzero, in the accumulator type.
template <int K, typename Acc>
__device__ __forceinline__ void pair_term(float xf, float yf, double p, Acc& a0, Acc& a1) {
    if (K == M_DOT || K == M_COSINE || K == M_CORRELATION) {
        a0 = (Acc)xf * (Acc)yf;
        a1 = 0;
    } else if (K == M_EUCLIDEAN || K == M_SQEUCLIDEAN) {
        a0 = (Acc)-2 * (Acc)xf * (Acc)yf;
        a1 = 0;
    } else if (K == M_MANHATTAN) {
        Acc x = xf, y = yf;
        a0 = fabs(x - y) - fabs(x) - fabs(y);
        a1 = 0;
    } else if (K == M_MINKOWSKI) {
        double x = xf, y = yf;
        a0 = (Acc)(pow(fabs(x - y), p) - pow(fabs(x), p) - pow(fabs(y), p));
        a1 = 0;
    } else if (K == M_CANBERRA) {
        Acc x = xf, y = yf;
        a0 = fabs(x - y) / (fabs(x) + fabs(y)) - (Acc)2;
        a1 = 0;
    } else if (K == M_BRAYCURTIS) {
        Acc x = xf, y = yf;
        Acc base = fabs(x) + fabs(y);
        a0 = fabs(x - y) - base;
        a1 = fabs(x + y) - base;
    } else if (K == M_HAMMING) {
        a0 = xf != yf ? (Acc)-1 : (Acc)-2;
        a1 = 0;
    } else if (K == M_JACCARD || K == M_DICE || K == M_RUSSELLRAO) {
        a0 = 1;
        a1 = 0;
    } else if (K == M_HELLINGER) {
        a0 = (Acc)(-2.0 * sqrt((double)xf * (double)yf));
        a1 = 0;
    } else if (K == M_JENSENSHANNON) {
        double x = xf, y = yf;
        double m = 0.5 * (x + y);
        a0 = (Acc)(x * log(x / m) + y * log(y / m) - (x + y) * LN_2);
        a1 = 0;
    } else if (K == M_KL) {
        a0 = (Acc)((double)xf * log((double)xf / (double)yf));
        a1 = 1;
    } else {
        a0 = 0;
        a1 = 0;
    }
}

// a0 + b0 + acc of a folded sum, clamped at 0. The float64 sum of the shared columns cancels the
// totals up to rounding that depends on the atomics' order (about 1e-16 of the totals); for an
// exact duplicate a root (hellinger, jensen-shannon, minkowski) would turn that residue into a
// visible distance (cube root of 1e-12 is 1e-4), so a residue under 1e-13 of the totals is 0.
__device__ __forceinline__ double folded(double a0, double b0, double acc, double scale) {
    double v = a0 + b0 + acc;
    return v <= 1e-13 * scale ? 0.0 : v;
}

// The distance from the accumulated sums and both rows' totals (the Rust `finish`).
template <int K>
__device__ __forceinline__ double finish(double acc0, double acc1, double a0, double a1, double b0,
                                         double b1, double p, double d) {
    switch (K) {
    case M_DOT: return acc0;
    case M_COSINE:
        if (a0 == 0.0 || b0 == 0.0) return 1.0;
        return fmin(fmax(1.0 - acc0 / (sqrt(a0) * sqrt(b0)), 0.0), 2.0);
    case M_SQEUCLIDEAN: return fmax(a0 + b0 + acc0, 0.0);
    case M_EUCLIDEAN: return sqrt(fmax(a0 + b0 + acc0, 0.0));
    case M_MANHATTAN:
    case M_CANBERRA: return folded(a0, b0, acc0, a0 + b0);
    case M_MINKOWSKI: return pow(folded(a0, b0, acc0, a0 + b0), 1.0 / p);
    case M_BRAYCURTIS: {
        double num = folded(a0, b0, acc0, a0 + b0);
        double den = fmax(a0 + b0 + acc1, 0.0);
        if (den == 0.0) return num == 0.0 ? 0.0 : __longlong_as_double(0x7ff0000000000000ll);
        return num / den;
    }
    case M_HAMMING: return fmax(a0 + b0 + acc0, 0.0) / d;
    case M_JACCARD: {
        double uni = a0 + b0 - acc0;
        return uni <= 0.0 ? 0.0 : 1.0 - acc0 / uni;
    }
    case M_DICE: {
        double total = a0 + b0;
        return total <= 0.0 ? 0.0 : 1.0 - 2.0 * acc0 / total;
    }
    case M_RUSSELLRAO: return (d - acc0) / d;
    case M_CORRELATION: {
        double var_a = a1 - a0 * a0 / d;
        double var_b = b1 - b0 * b0 / d;
        const double CONSTANT = 1e-12;
        if (var_a <= CONSTANT * a1 || var_b <= CONSTANT * b1) return 1.0;
        double cov = acc0 - a0 * b0 / d;
        return fmin(fmax(1.0 - cov / (sqrt(var_a) * sqrt(var_b)), 0.0), 2.0);
    }
    case M_HELLINGER: return sqrt(folded(a0, b0, acc0, a0 + b0)) / SQRT_2;
    case M_JENSENSHANNON: {
        double v = (a0 + b0) * LN_2 + acc0;
        return v <= 1e-13 * (a0 + b0) ? 0.0 : sqrt(0.5 * v);
    }
    case M_KL:
        // Some x > 0 has y = 0 unless every nonzero of the left row is shared.
        return acc1 < a0 ? __longlong_as_double(0x7ff0000000000000ll) : acc0;
    default: return 0.0;
    }
}
