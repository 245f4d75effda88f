// The certified metrics' exact step on the device (src/gpu/index/exact.rs): a reduced sum (or
// max) over the union of two rows' columns for each candidate pair, and each row's one-sided sum.
// The host finishes the reduced sums with the metric's own `finish` (one call a pair, where the
// walk over both rows was the host's cost), so a distance is the CPU's bits wherever the terms
// are: they are summed here in the CPU's order (`union_distance` in src/metric/mod.rs), each
// addition rounded on its own.
//
// Rows are CSR of (column, value bits) as `uint2`, sorted by column, zeros left out: the right
// side's as `join::ExactRows` keeps them, the left batch's sorted on the host.
#if CERTIFIED_PROBES

// Rows `a` (`na` entries) and `b` (`nb`) reduced over the union: the left-only, right-only and
// shared terms each summed in column order, then added in that order; a max takes the largest.
__device__ double union_reduced(const uint2* a, long long na, const uint2* b, long long nb,
                                const Params& prm) {
    double only_a = 0.0, only_b = 0.0, shared = 0.0;
    long long i = 0, j = 0;
    while (i < na || j < nb) {
        double x = 0.0, y = 0.0;
        if (j == nb || (i < na && (int)a[i].x < (int)b[j].x)) {
            x = (double)__uint_as_float(a[i++].y);
        } else if (i == na || (int)b[j].x < (int)a[i].x) {
            y = (double)__uint_as_float(b[j++].y);
        } else {
            x = (double)__uint_as_float(a[i++].y);
            y = (double)__uint_as_float(b[j++].y);
        }
        const double t = MetricDef::term(x, y, prm);
        if (METRIC_REDUCTION_MAX) {
            only_a = fmax(only_a, t);
        } else if (y == 0.0) {
            only_a = __dadd_rn(only_a, t);
        } else if (x == 0.0) {
            only_b = __dadd_rn(only_b, t);
        } else {
            shared = __dadd_rn(shared, t);
        }
    }
    return METRIC_REDUCTION_MAX ? only_a : __dadd_rn(__dadd_rn(only_a, only_b), shared);
}

// Pair i: left row pair_left[i] (rows l_ptr / l_ent) against right row pair_right[i] (r_ptr /
// r_ent). A thread a pair; pairs come grouped by left row, so a warp reads one left row.
extern "C" __global__ void exact_pairs(const ExactArgs a) {
    const Params prm = {a.p, a.d};
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < a.n;
         i += (long long)gridDim.x * blockDim.x) {
        const u32 l = a.pair_left[i], r = a.pair_right[i];
        const long long l0 = a.l_ptr[l], r0 = a.r_ptr[r];
        a.out[i] = union_reduced(a.l_ent + l0, a.l_ptr[l + 1] - l0, a.r_ent + r0,
                                 a.r_ptr[r + 1] - r0, prm);
    }
}

// Each of `n` rows (l_ptr / l_ent) against a row it shares no column with, reduced: the terms
// against zeros (`side` 0: the row is the left one, 1: the right one) summed in column order, as
// `one_sided_sum` and `union_reduced` sum them: a left row's plus a right row's (plus 0) is then
// the very sum `exact_pairs` gives the pair when they share no column.
extern "C" __global__ void exact_one_sided(const ExactArgs a) {
    const Params prm = {a.p, a.d};
    for (long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x; row < a.n;
         row += (long long)gridDim.x * blockDim.x) {
        double s = 0.0;
        for (long long e = a.l_ptr[row]; e < a.l_ptr[row + 1]; ++e) {
            const double v = (double)__uint_as_float(a.l_ent[e].y);
            const double t = a.side == 0 ? MetricDef::term(v, 0.0, prm) : MetricDef::term(0.0, v, prm);
            s = METRIC_REDUCTION_MAX ? fmax(s, t) : __dadd_rn(s, t);
        }
        a.out[row] = s;
    }
}

#endif
