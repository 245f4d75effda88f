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
