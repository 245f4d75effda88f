// The distance matrix of the folded metrics (`GpuIndex::distance_matrix`, src/gpu/index/matrix.rs):
// every left row of a chunk against every right row, finished into an m x n block of float64 on
// the device, which the host copies out once. Pairs never leave the device one by one.
//
// A block per (left row, tile of right rows): the tile's sums live in shared memory, one float64
// (two for a metric with two accumulators) per right row. The left row's nonzeros (already mapped
// to the right side's column ids on the host) are taken in their stored order; for each, the part
// of that column's inverted list inside the tile (`tile_ptr`, the knn kernels' own split points,
// a matrix tile being `group` of their tiles) is added by all threads of the block, with a barrier
// between columns. Within one column's list every right row appears once, so no two threads add to
// one sum at once: plain loads and stores, no atomics, and each pair's terms are added in one
// order on every run (the left row's), the CPU's order except for its dense columns, which it
// takes first. Float64 sums rather than knn.cu's fixed point: the block holds every pair's sum
// until it is finished, and float64 keeps a pair whose few shared terms are small against the
// left row's largest as exact as the CPU's sums.
//
// Every slot of the tile is then finished with both rows' totals, as the CPU's `finish` does:
// pairs sharing no column finish from a sum of 0 (the semiring's zero), empty rows from zero
// totals; a NULL row on either side gives NaN.

__device__ __forceinline__ double matrix_nan() { return __longlong_as_double(0x7ff8000000000000ll); }

// List entries a thread loads before it adds them: independent loads in flight hide their latency
// (the adds wait on them; each slot is a different right row, so the order does not matter).
#define MATRIX_UNROLL 4

extern "C" __global__ void __launch_bounds__(MATRIX_THREADS) distance_matrix(const MatrixArgs a) {
    extern __shared__ __align__(16) unsigned char matrix_smem[];
    const bool TWO = MetricDef::TWO;
    const int B = MATRIX_THREADS;
    // acc0[span] | acc1[span]: a tile's sums (span = the tile's rows, or the right side's if fewer)
    double* acc0 = (double*)matrix_smem;
    double* acc1 = acc0 + a.span;
    // One batch of the left row's nonzeros: each one's list segment in the tile (start, length),
    // its value, and for a lifted metric its lift.
    __shared__ uint2 seg[MATRIX_THREADS];
    __shared__ float seg_x[MATRIX_THREADS];
    __shared__ double seg_lift[MetricDef::LIFTED ? MATRIX_THREADS : 1];
    const Params prm = {a.p, a.d};
    const int row = blockIdx.x;
    const long long h0 = a.hit_off[row];
    const int deg = (int)(a.hit_off[row + 1] - h0);
    const bool null_row = a.l_null[row] != 0;
    const Totals lt = {a.lt0[row], a.lt1[row]};
    double* out = a.out + (size_t)row * (size_t)a.out_stride;
    const uint2* __restrict__ entries = a.col_entries;
    const double* __restrict__ lifts = a.col_lift;

    for (int t = blockIdx.y; t < a.mtiles; t += gridDim.y) {
        const int first = t * a.mtile_rows;
        const int len = min(a.mtile_rows, a.n_right - first);
        if (null_row) {
            for (int j = threadIdx.x; j < len; j += B) out[first + j] = matrix_nan();
            continue;
        }
        for (int j = threadIdx.x; j < len; j += B) {
            acc0[j] = 0.0;
            if (TWO) acc1[j] = 0.0;
        }
        const int it0 = t * a.group;
        const int it1 = min(it0 + a.group, a.ntiles);
        for (int c0 = 0; c0 < deg; c0 += B) {
            // (the zeroing, or the last batch's reads of its segments, are done)
            __syncthreads();
            const int e = c0 + threadIdx.x;
            if (e < deg) {
                const uint2 hit = a.hits[h0 + e];  // (column id, value bits)
                const u32* tp = a.tile_ptr + (size_t)hit.x * (size_t)(a.ntiles + 1);
                const u32 s = tp[it0];
                seg[threadIdx.x] = make_uint2(s, tp[it1] - s);
                seg_x[threadIdx.x] = __uint_as_float(hit.y);
                if (MetricDef::LIFTED)
                    seg_lift[threadIdx.x] = MetricDef::lift((double)__uint_as_float(hit.y), prm);
            }
            __syncthreads();
            const int nseg = min(B, deg - c0);
            for (int s = 0; s < nseg; ++s) {
                const uint2 sg = seg[s];
                // (every thread reads the same length: the barrier below is skipped by all or none)
                if (sg.y == 0) continue;
                const double x = (double)seg_x[s];
                const double lx = MetricDef::LIFTED ? seg_lift[s] : 0.0;
                for (u32 q0 = threadIdx.x; q0 < sg.y; q0 += MATRIX_UNROLL * B) {
                    uint2 en[MATRIX_UNROLL];
                    double ly[MATRIX_UNROLL];
#pragma unroll
                    for (int u = 0; u < MATRIX_UNROLL; ++u) {
                        const u32 q = q0 + (u32)(u * B);
                        if (q < sg.y) {
                            en[u] = entries[sg.x + q];
                            ly[u] = MetricDef::LIFTED ? lifts[sg.x + q] : 0.0;
                        }
                    }
#pragma unroll
                    for (int u = 0; u < MATRIX_UNROLL; ++u) {
                        const u32 q = q0 + (u32)(u * B);
                        if (q < sg.y) {
                            const int j = (int)en[u].x - first;
                            const double y = (double)__uint_as_float(en[u].y);
                            acc0[j] += MetricDef::pair0_lifted(x, lx, y, ly[u], prm);
                            if (TWO) acc1[j] += MetricDef::pair1_lifted(x, lx, y, ly[u], prm);
                        }
                    }
                }
                __syncthreads();
            }
        }
        __syncthreads();
        for (int j = threadIdx.x; j < len; j += B) {
            const int r = first + j;
            double dist;
            if (a.valid_bits && !row_valid(a.valid_bits, r)) {
                dist = matrix_nan();
            } else {
                const Totals rt = {a.rt0[r], a.rt1[r]};
                dist = MetricDef::finish(acc0[j], TWO ? acc1[j] : 0.0, lt, rt, prm);
            }
            out[first + j] = dist;
        }
        // (the next tile zeroes the sums this one just read)
        __syncthreads();
    }
}
