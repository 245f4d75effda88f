// The vocabulary of metric formulas, shared by every generated module: the CUDA twins of
// src/metric/math.rs (same names, same meaning), so a formula written once in src/metric is both
// Rust and CUDA C. fabs, sqrt, log, fmax and fmin are CUDA's own (double overloads), log_positive is
// CUDA's log; pow is CUDA's behind the small-integer products of `metric_pow` (see `pow` in
// src/metric/math.rs).
//
// A module is: this prelude, the kernel argument structs (generated from src/gpu/args.rs), one
// metric's `MetricDef` (generated from src/metric by src/metric/cuda.rs), then knn.cu.

typedef unsigned int u32;
typedef unsigned long long u64;

// A metric's parameters (`prm.p`, `prm.d`) and one row's totals (`l.t0`, `r.t1`).
struct Params {
    double p;
    double d;
};
struct Totals {
    double t0;
    double t1;
};

#define INF (__longlong_as_double(0x7ff0000000000000ll))
#define LN_2 0.6931471805599453
#define SQRT_2 1.4142135623730951

__device__ __forceinline__ double select(bool c, double a, double b) { return c ? a : b; }
// See `log_positive` in src/metric/math.rs: CUDA's `log` has no checks to skip.
__device__ __forceinline__ double log_positive(double x) { return log(x); }
__device__ __forceinline__ double clamp(double x, double lo, double hi) { return fmin(fmax(x, lo), hi); }
// See `folded` in src/metric/math.rs.
__device__ __forceinline__ double folded(double sum, double scale) {
    return sum <= 1e-13 * scale ? 0.0 : sum;
}

// See `pow` in src/metric/math.rs: minkowski's usual p = 1..4 as products, a few instructions where
// CUDA's double pow takes over a hundred (p is the same for every thread, so no divergence).
__device__ __forceinline__ double metric_pow(double x, double y) {
    if (y == 2.0) return x * x;
    if (y == 3.0) return x * x * x;
    if (y == 1.0) return x;
    if (y == 4.0) { const double x2 = x * x; return x2 * x2; }
    return pow(x, y);
}
#define pow metric_pow

// See `log` in src/metric/math.rs: fdlibm's reduction and polynomial, every operation rounded on
// its own (no fused multiply-add), so that it gives the CPU's bits. The exact step's terms use it
// (`MetricDef::term`, see src/metric/cuda.rs): the exact distances computed on the device are then
// the CPU's where their terms are (jensenshannon), not within an ulp of them.
__device__ __forceinline__ double exact_log(double x) {
    const bool subnormal = x < 2.2250738585072014e-308;
    const double scaled = subnormal ? __dmul_rn(x, 18014398509481984.0) : x;  // 2^54
    const u64 bits = (u64)__double_as_longlong(scaled);
    const u64 hx = (bits >> 32) + (0x3ff00000ull - 0x3fe6a09eull);
    const u64 k_bits = (hx >> 20) & 0x7ffull;
    const u64 m_hi = (hx & 0x000fffffull) + 0x3fe6a09eull;
    const double m = __longlong_as_double((long long)((m_hi << 32) | (bits & 0xffffffffull)));
    const double k0 = __dsub_rn(__dsub_rn(__longlong_as_double((long long)(0x4330000000000000ull | k_bits)),
                                          4503599627370496.0),
                                1023.0);
    const double f = __dsub_rn(m, 1.0);
    const double hfsq = __dmul_rn(__dmul_rn(0.5, f), f);
    const double s = __ddiv_rn(f, __dadd_rn(2.0, f));
    const double z = __dmul_rn(s, s);
    const double k = __dsub_rn(k0, subnormal ? 54.0 : 0.0);
    const double w = __dmul_rn(z, z);
    const double t1 = __dmul_rn(w, __dadd_rn(3.999999999940941908e-1,
                                 __dmul_rn(w, __dadd_rn(2.222219843214978396e-1,
                                                        __dmul_rn(w, 1.531383769920937332e-1)))));
    const double t2 = __dmul_rn(z, __dadd_rn(6.666666666666735130e-1,
                                 __dmul_rn(w, __dadd_rn(2.857142874366239149e-1,
                                 __dmul_rn(w, __dadd_rn(1.818357216161805012e-1,
                                                        __dmul_rn(w, 1.479819860511658591e-1)))))));
    const double r = __dadd_rn(t2, t1);
    const double ln = __dadd_rn(__dadd_rn(__dsub_rn(__dadd_rn(__dmul_rn(s, __dadd_rn(hfsq, r)),
                                                              __dmul_rn(k, 1.90821492927058770002e-10)),
                                                    hfsq),
                                          f),
                                __dmul_rn(k, 6.93147180369123816490e-1));
    return (x > 0.0 && x < INF) ? ln : (x == 0.0 ? -INF : (x == INF ? INF : __longlong_as_double(0x7ff8000000000000ll)));
}
