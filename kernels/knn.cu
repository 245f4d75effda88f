// Exact kNN and radius joins over sparse vectors (CSR left batch against a resident right side),
// generic over the metric: every formula comes from `MetricDef`, generated from src/metric.
//
// Folded metrics (all but chebyshev): one thread block per left row. The right rows are cut into
// tiles of `tile_rows`; for each tile the block accumulates the folded sum of every right row of
// the tile in shared memory, walking for each nonzero column of the left row the part of that
// column's inverted list (CSC, row-sorted) that falls inside the tile. The split points of every
// column at every tile boundary are precomputed (`tile_ptr`), so no binary search is needed. The
// work of all the left row's columns is flattened into one index space (an exclusive scan of the
// segment lengths), so a popular column with a long list is spread over all threads of the block
// and a left row of high degree is taken in chunks of the block size: skewed degrees on either
// side keep every thread busy. Then every right row of the tile is finished with both rows'
// totals and offered to the block's running top-k (a candidate buffer filtered by the current
// k-th key, compacted by a bitonic sort when it fills), or for a radius join appended to a global
// pair list through an atomic counter. No m×n matrix exists anywhere; only k pairs per left row
// leave the block.
//
// Keys: the distance as float, mapped to an unsigned integer whose order is the float order, in
// the high 32 bits, and the right row in the low 32 bits. Sorting the 64-bit composite gives the
// SPEC's order (nearest first, ties to the smaller right row) with no separate tie rule.

#define NO_KEY 0xffffffffffffffffull
// `self_first` when exclude_self is off.
#define NO_SELF (-0x7fffffffffffffffll - 1)

__device__ __forceinline__ u32 float_to_ordered(float f) {
    u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float ordered_to_float(u32 k) {
    u32 b = (k & 0x80000000u) ? (k ^ 0x80000000u) : ~k;
    return __uint_as_float(b);
}

// Exclusive scan of `v` over the block (blockDim.x a multiple of 32, at most 1024); `total` gets
// the sum. `warp_sums` holds 32 words of shared memory.
__device__ __forceinline__ u32 block_exclusive_scan(u32 v, u32* warp_sums, u32* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    u32 x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u32 y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        u32 s = lane < nwarps ? warp_sums[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            u32 y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        warp_sums[lane] = s;  // inclusive sums of warps
    }
    __syncthreads();
    u32 before = (warp > 0 ? warp_sums[warp - 1] : 0) + x - v;
    *total = warp_sums[nwarps - 1];
    __syncthreads();
    return before;
}

__device__ __forceinline__ double block_sum(double v, double* scratch) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double s = 0.0;
    for (int w = 0; w < nwarps; ++w) s += scratch[w];
    __syncthreads();
    return s;
}

// Sorts cand[0..cap) ascending (cap a power of two), all threads of the block.
__device__ void bitonic_sort(u64* cand, int cap) {
    for (int size = 2; size <= cap; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < (cap >> 1); i += blockDim.x) {
                int lo = 2 * stride * (i / stride) + (i % stride);
                int hi = lo + stride;
                bool asc = (lo & size) == 0;
                u64 a = cand[lo], b = cand[hi];
                if ((a > b) == asc) {
                    cand[lo] = b;
                    cand[hi] = a;
                }
            }
            __syncthreads();
        }
    }
}

// The running top-k of one block: `cand` holds `*count` entries, unsorted after the last
// compaction; keys at or above `*tau` cannot enter.
__device__ void topk_compact(u64* cand, int cap, int k, int* count, u64* tau) {
    __syncthreads();
    int n = *count;
    for (int i = n + threadIdx.x; i < cap; i += blockDim.x) cand[i] = NO_KEY;
    __syncthreads();
    bitonic_sort(cand, cap);
    if (threadIdx.x == 0) {
        int kept = n < k ? n : k;
        *count = kept;
        if (n >= k) *tau = cand[k - 1];
    }
    __syncthreads();
}

__device__ __forceinline__ bool row_valid(const u32* bits, int j) {
    return (bits[j >> 5] >> (j & 31)) & 1u;
}

// Maps a left column index to the right side's column id, or -1 when the right side never uses it.
__device__ __forceinline__ int map_column(int c, int col_mode, int ncols, const int* col_ids) {
    if (col_mode == 0) return (c >= 0 && c < ncols) ? c : -1;
    int lo = 0, hi = ncols;
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (col_ids[mid] < c) lo = mid + 1; else hi = mid;
    }
    return (lo < ncols && col_ids[lo] == c) ? lo : -1;
}


#if !METRIC_REDUCTION_MAX
template <bool RADIUS> __device__ void folded_body(const FoldedArgs& a) {
    typedef MetricDef::Acc Acc;
    const int* l_off = a.l_off;
    const long long l_base = a.l_base;
    const int* l_idx = a.l_idx;
    const float* l_val = a.l_val;
    const int* work = a.work;
    const int nwork = a.nwork, n_right = a.n_right;
    const long long self_first = a.self_first;
    const u32* valid_bits = a.valid_bits;
    const void* rt0v = a.rt0;
    const void* rt1v = a.rt1;
    const int col_mode = a.col_mode, ncols = a.ncols;
    const int* col_ids = a.col_ids;
    const u32* tile_ptr = a.tile_ptr;
    const u32* col_rows = a.col_rows;
    const float* col_vals = a.col_vals;
    const int tile_rows = a.tile_rows, ntiles = a.ntiles;
    const Params prm = {a.p, a.d};
    const int k = a.k, cap = a.cap;
    const double radius = a.radius;
    const u64 r_cap = a.r_cap;
    extern __shared__ __align__(16) unsigned char smem[];
    const int B = blockDim.x;
    const bool TWO = MetricDef::TWO;
    const Acc* rt0 = (const Acc*)rt0v;
    const Acc* rt1 = (const Acc*)rt1v;
    // Shared memory: acc0[tile] (acc1[tile]) | cand[cap] (knn) | seg_start[B] seg_off[B] seg_x[B]
    Acc* acc0 = (Acc*)smem;
    Acc* acc1 = acc0 + tile_rows;
    unsigned char* after_acc = (unsigned char*)(acc0 + (TWO ? 2 : 1) * tile_rows);
    u64* cand = (u64*)after_acc;
    u32* seg_start = (u32*)(cand + (RADIUS ? 0 : cap));
    u32* seg_off = seg_start + B;
    float* seg_x = (float*)(seg_off + B);
    __shared__ u32 warp_sums[32];
    __shared__ double red[32];
    __shared__ int s_count;
    __shared__ u64 s_tau;

    for (int w = blockIdx.x; w < nwork; w += gridDim.x) {
        const int row = work[w];
        const long long start = (long long)l_off[row] - l_base;
        const long long end = (long long)l_off[row + 1] - l_base;
        const int deg = (int)(end - start);
        const long long self_row = self_first != NO_SELF ? self_first + row : -1;

        // Left totals in float64 (every thread sums a strided part; block reduction).
        double t0 = 0.0, t1 = 0.0;
        for (int e = threadIdx.x; e < deg; e += B) {
            float x = l_val[start + e];
            if (x != 0.0f) {
                t0 += MetricDef::total0((double)x, prm);
                t1 += MetricDef::total1((double)x, prm);
            }
        }
        const double lt0 = block_sum(t0, red);
        const double lt1 = block_sum(t1, red);
        if (threadIdx.x == 0) {
            s_count = 0;
            s_tau = NO_KEY;
        }
        __syncthreads();

        for (int t = 0; t < ntiles; ++t) {
            const int tile_first = t * tile_rows;
            const int tile_len = min(tile_rows, n_right - tile_first);
            for (int j = threadIdx.x; j < tile_len; j += B) {
                acc0[j] = 0;
                if (TWO) acc1[j] = 0;
            }
            __syncthreads();
            // Accumulate, a chunk of B left nonzeros at a time.
            for (int c0 = 0; c0 < deg; c0 += B) {
                u32 len = 0, sstart = 0;
                float x = 0.0f;
                int e = c0 + threadIdx.x;
                if (e < deg) {
                    x = l_val[start + e];
                    int col = x != 0.0f ? map_column(l_idx[start + e], col_mode, ncols, col_ids) : -1;
                    if (col >= 0) {
                        const u32* tp = tile_ptr + (size_t)col * (ntiles + 1) + t;
                        sstart = tp[0];
                        len = tp[1] - sstart;
                    }
                }
                u32 total;
                u32 off = block_exclusive_scan(len, warp_sums, &total);
                seg_start[threadIdx.x] = sstart;
                seg_off[threadIdx.x] = off;
                seg_x[threadIdx.x] = x;
                __syncthreads();
                const int nseg = min(B, deg - c0);
                // Work item q of the flattened chunk: its segment is the last with seg_off <= q
                // (a binary search in shared memory). Tried on the device: one broadcast search
                // per warp-group of 32 items instead was 10% slower on scrna (the shared-memory
                // atomics, not the search, are the cost), so the plain form stays.
                for (u32 q = threadIdx.x; q < total; q += B) {
                    int lo = 0, hi = nseg - 1;
                    while (lo < hi) {
                        int mid = (lo + hi + 1) >> 1;
                        if (seg_off[mid] <= q) lo = mid; else hi = mid - 1;
                    }
                    u32 pos = seg_start[lo] + (q - seg_off[lo]);
                    int j = (int)col_rows[pos] - tile_first;
                    const double x = seg_x[lo], y = col_vals[pos];
                    atomicAdd(&acc0[j], (Acc)MetricDef::pair0(x, y, prm));
                    if (TWO) atomicAdd(&acc1[j], (Acc)MetricDef::pair1(x, y, prm));
                }
                __syncthreads();
            }
            // Finish every right row of the tile and select.
            for (int b0 = 0; b0 < tile_len; b0 += B) {
                int jj = b0 + threadIdx.x;
                if (jj < tile_len) {
                    int j = tile_first + jj;
                    if (row_valid(valid_bits, j) && (long long)j != self_row) {
                        const Totals lt = {lt0, lt1};
                        const Totals rt = {MetricDef::NEEDS_RT0 ? (double)rt0[j] : 0.0,
                                           MetricDef::NEEDS_RT1 ? (double)rt1[j] : 0.0};
                        double a1v = TWO ? (double)acc1[jj] : 0.0;
                        double dist = MetricDef::finish((double)acc0[jj], a1v, lt, rt, prm);
                        if (RADIUS) {
                            bool inside = MetricDef::SIMILARITY ? dist >= radius : dist <= radius;
                            if (inside) {
                                u64 slot = atomicAdd(a.r_counter, 1ull);
                                if (slot < r_cap) {
                                    a.r_left[slot] = (u32)row;
                                    a.r_right[slot] = (u32)j;
                                    a.r_dist[slot] = dist;
                                }
                            }
                        } else {
                            float key = (float)(MetricDef::SIMILARITY ? -dist : dist);
                            u64 c = ((u64)float_to_ordered(key) << 32) | (u64)(u32)j;
                            if (c < s_tau) {
                                int slot = atomicAdd(&s_count, 1);
                                cand[slot] = c;
                            }
                        }
                    }
                }
                if (!RADIUS) {
                    __syncthreads();
                    // At most B entries arrive per round: compact before the buffer can overflow.
                    // Every thread reads the count before any thread can add to it again.
                    const int cnt = s_count;
                    __syncthreads();
                    if (cnt > cap - B) topk_compact(cand, cap, k, &s_count, &s_tau);
                }
            }
            __syncthreads();
        }
        if (!RADIUS) {
            topk_compact(cand, cap, k, &s_count, &s_tau);
            const int n = s_count;
            for (int i = threadIdx.x; i < n; i += B) {
                u64 c = cand[i];
                a.out_rows[(size_t)w * k + i] = (u32)(c & 0xffffffffull);
                float key = ordered_to_float((u32)(c >> 32));
                a.out_keys[(size_t)w * k + i] = MetricDef::SIMILARITY ? -key : key;
            }
            if (threadIdx.x == 0) a.out_count[w] = n;
            __syncthreads();
        }
    }
}

extern "C" __global__ void folded_knn(const FoldedArgs a) { folded_body<false>(a); }
extern "C" __global__ void folded_radius(const FoldedArgs a) { folded_body<true>(a); }
#endif

// Max-reduced metrics (chebyshev): max over the union of supports, so no folded form. The term is
// MetricDef::term; a missing side is 0 (term(0, y) = |y| and term(x, 0) = |x|, see
// `Reduction::Max` in src/metric/define.rs). One block per left row (the
// grid is capped at the number of `dense` scratch slots). The left row is scattered into its
// block's slot of a dense array over the right side's columns; each warp walks right rows (CSR,
// column-sorted): shared columns give |x - y|, right-only ones |y|. The largest |x| over left-only
// columns is the first entry of the left row's list sorted by |x| (descending, prepared with the
// batch) that the right row lacks: a warp tests 32 entries at a time by binary search in the
// right row.
#if METRIC_REDUCTION_MAX
template <bool RADIUS> __device__ void maxred_body(const MaxArgs& a) {
    const int* work = a.work;
    const int nwork = a.nwork, n_right = a.n_right;
    const long long self_first = a.self_first;
    const int* ch_off = a.ch_off;
    const int* ch_col = a.ch_col;
    const float* ch_val = a.ch_val;
    const u32* valid_bits = a.valid_bits;
    const int ncols = a.ncols;
    const u32* r_ptr = a.r_ptr;
    const int* r_col = a.r_col;
    const float* r_val = a.r_val;
    float* dense = a.dense;
    const Params prm = {a.p, a.d};
    const int k = a.k, cap = a.cap;
    const double radius = a.radius;
    const u64 r_cap = a.r_cap;
    extern __shared__ __align__(16) unsigned char smem[];
    const int B = blockDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = B >> 5;
    u64* cand = (u64*)smem;
    float* dist_s = (float*)(cand + (RADIUS ? 0 : cap));
    double* dist_d = (double*)smem;  // radius: exact distances of the current chunk
    __shared__ int s_count;
    __shared__ u64 s_tau;
    float* slot = dense + (size_t)blockIdx.x * ncols;

    for (int w = blockIdx.x; w < nwork; w += gridDim.x) {
        const int row = work[w];
        const int e0 = ch_off[w], e1 = ch_off[w + 1];
        const long long self_row = self_first != NO_SELF ? self_first + row : -1;
        for (int e = e0 + threadIdx.x; e < e1; e += B) {
            int col = ch_col[e];
            if (col >= 0) slot[col] = ch_val[e];
        }
        if (threadIdx.x == 0) {
            s_count = 0;
            s_tau = NO_KEY;
        }
        __syncthreads();
        for (int b0 = 0; b0 < n_right; b0 += B) {
            const int chunk = min(B, n_right - b0);
            for (int jj = warp; jj < chunk; jj += nwarps) {
                const int j = b0 + jj;
                const u32 p0 = r_ptr[j], p1 = r_ptr[j + 1];
                float m = 0.0f;
                for (u32 q = p0 + lane; q < p1; q += 32) {
                    float y = r_val[q];
                    float x = slot[r_col[q]];
                    m = fmaxf(m, (float)MetricDef::term(x, y, prm));
                }
                // Left-only columns: the largest |x| the right row lacks.
                for (int base = e0; base < e1; base += 32) {
                    int e = base + lane;
                    bool missing = false;
                    if (e < e1) {
                        int col = ch_col[e];
                        missing = true;
                        if (col >= 0) {
                            u32 lo = p0, hi = p1;
                            while (lo < hi) {
                                u32 mid = (lo + hi) >> 1;
                                if (r_col[mid] < col) lo = mid + 1; else hi = mid;
                            }
                            missing = !(lo < p1 && r_col[lo] == col);
                        }
                    }
                    u32 ballot = __ballot_sync(0xffffffffu, missing);
                    if (ballot) {
                        int first = __ffs(ballot) - 1;
                        if (lane == first) m = fmaxf(m, (float)MetricDef::term(ch_val[e], 0.0, prm));
                        break;
                    }
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                if (lane == 0) {
                    if (RADIUS) dist_d[jj] = (double)m; else dist_s[jj] = m;
                }
            }
            __syncthreads();
            if (threadIdx.x < chunk) {
                const int j = b0 + threadIdx.x;
                if (row_valid(valid_bits, j) && (long long)j != self_row) {
                    if (RADIUS) {
                        double dist = dist_d[threadIdx.x];
                        if (MetricDef::SIMILARITY ? dist >= radius : dist <= radius) {
                            u64 s = atomicAdd(a.r_counter, 1ull);
                            if (s < r_cap) {
                                a.r_left[s] = (u32)row;
                                a.r_right[s] = (u32)j;
                                a.r_dist[s] = dist;
                            }
                        }
                    } else {
                        u64 c = ((u64)float_to_ordered(dist_s[threadIdx.x]) << 32) | (u64)(u32)j;
                        if (c < s_tau) {
                            int s = atomicAdd(&s_count, 1);
                            cand[s] = c;
                        }
                    }
                }
            }
            __syncthreads();
            if (!RADIUS && s_count > cap - B) topk_compact(cand, cap, k, &s_count, &s_tau);
        }
        if (!RADIUS) {
            topk_compact(cand, cap, k, &s_count, &s_tau);
            const int n = s_count;
            for (int i = threadIdx.x; i < n; i += B) {
                u64 c = cand[i];
                a.out_rows[(size_t)w * k + i] = (u32)(c & 0xffffffffull);
                a.out_keys[(size_t)w * k + i] = ordered_to_float((u32)(c >> 32));
            }
            if (threadIdx.x == 0) a.out_count[w] = n;
        }
        // Clear the slot for the next left row.
        for (int e = e0 + threadIdx.x; e < e1; e += B) {
            int col = ch_col[e];
            if (col >= 0) slot[col] = 0.0f;
        }
        __syncthreads();
    }
}

extern "C" __global__ void maxred_knn(const MaxArgs a) { maxred_body<false>(a); }
extern "C" __global__ void maxred_radius(const MaxArgs a) { maxred_body<true>(a); }
#endif
