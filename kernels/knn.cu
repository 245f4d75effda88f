// Exact kNN and radius joins over sparse vectors (CSR left batch against a resident right side),
// generic over the metric: every formula comes from `MetricDef`, generated from src/metric.
//
// Every metric runs these folded kernels (sums, and chebyshev's max through `max_pair`; the sums
// with an exact union term and the max return bounds, see src/gpu/index.rs): one thread block
// per left row.
// The right rows are cut into tiles of `tile_rows`; for each tile the block accumulates the folded
// sum of every right row of the tile in shared memory, walking for each nonzero column of the
// left row the part of that column's inverted list (CSC, row-sorted) that falls inside the tile.
// The split points of every column at every tile boundary are precomputed (`tile_ptr`), so no
// binary search is needed. The work of all the left row's columns is flattened into one index
// space (an exclusive scan of the segment lengths), so a popular column with a long list is spread
// over all threads of the block and a left row of high degree is taken in chunks of the block
// size: skewed degrees on either side keep every thread busy. Then every right row of the tile is
// finished with both rows' totals and offered to the block's running top-k (a candidate buffer
// filtered by the current k-th entry, compacted by a bitonic sort when it fills), or for a radius
// join appended to a global pair list through an atomic counter. No m×n matrix exists anywhere;
// only k pairs per left row leave the block.
//
// Accumulation is in 64-bit fixed point, not floating point: each pair term is rounded to a
// multiple of 2^-s, s chosen per left row from a bound on the terms (the metric's pair terms at
// the right side's smallest and largest |y|, and at y = ±|x|; they are monotone in |y| or bounded
// there, see `term_bound`), so that no sum of the row can pass 2^62. Integer additions are exact
// and commute: the sums, hence the distances, are the same bits on every run whatever order the
// atomics land in (equal right rows tie exactly and keep the right side's row order), and their
// error is that of the rounding of each term (2^-61 of the bound), far below float64 sums of
// float atomics. A term above its bound (a definition whose terms are not bounded that way) sets
// `overflow` and the host reports it instead of returning wrong sums.
//
// Keys: the distance as a double mapped to an unsigned 64-bit integer whose order is the double
// order, plus the right row; (key, row) pairs compare lexicographically, which is the SPEC's order
// (nearest first, ties to the smaller right row) with no separate tie rule. Distances leave the
// kernel as doubles.

#define DBL_EPS 2.220446049250313e-16
#define NO_KEY 0xffffffffffffffffull
#define NO_ROW 0xffffffffu
// `self_first` when exclude_self is off.
#define NO_SELF (-0x7fffffffffffffffll - 1)

__device__ __forceinline__ u64 double_to_ordered(double f) {
    u64 b = (u64)__double_as_longlong(f);
    return (b & 0x8000000000000000ull) ? ~b : (b | 0x8000000000000000ull);
}

__device__ __forceinline__ double ordered_to_double(u64 k) {
    u64 b = (k & 0x8000000000000000ull) ? (k ^ 0x8000000000000000ull) : ~k;
    return __longlong_as_double((long long)b);
}

__device__ __forceinline__ bool entry_less(u64 ka, u32 ra, u64 kb, u32 rb) {
    return ka < kb || (ka == kb && ra < rb);
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

// Entries per thread of the folded kernels' segment map (`seg_map`: SEG_ITEMS * blockDim.x u16
// in shared memory; `launch::SEG_MAP_ITEMS` on the host sizes it).
#define SEG_ITEMS 4
// A chunk's segments come from the map when it has at least SEG_MAP_MIN_ITEMS work items and
// more than SEG_MAP_MIN_SEGMENTS segments, or at least SEG_MAP_MIN_ITEMS_2 and more than
// SEG_MAP_MIN_SEGMENTS_2 (`kernels::seg_map_rule` on the host).
#ifndef SEG_MAP_MIN_ITEMS
#define SEG_MAP_MIN_ITEMS 1025u
#define SEG_MAP_MIN_SEGMENTS 16u
#define SEG_MAP_MIN_ITEMS_2 2049u
#define SEG_MAP_MIN_SEGMENTS_2 8u
#endif

// Inclusive max-scan, in place, of the block's SEG_ITEMS * blockDim.x entries of `m`, each thread
// owning SEG_ITEMS consecutive ones; every entry also becomes at least `seed`. `warp_max` holds
// 32 words of shared memory. The same two-level shuffle scan as block_exclusive_scan, written out
// twice on purpose: one template for both (an inclusive scan under an operator, the exclusive
// prefix by subtraction for the sum and by a shuffle for the max) passed gpu_test but made the
// folded kernels 0.5-0.7% slower on movielens (calls AU, AV: 1.588 -> 1.599 s cosine).
__device__ __forceinline__ void block_max_scan(unsigned short* m, u32 seed, u32* warp_max) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    ushort4 v = reinterpret_cast<ushort4*>(m)[threadIdx.x];
    const u32 a = max(seed, (u32)v.x), b = max(a, (u32)v.y), c = max(b, (u32)v.z),
              d = max(c, (u32)v.w);
    u32 x = d;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u32 y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x = max(x, y);
    }
    u32 prev = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0) prev = 0;
    if (lane == 31) warp_max[warp] = x;
    __syncthreads();
    if (warp == 0) {
        u32 w = lane < nwarps ? warp_max[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            u32 y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w = max(w, y);
        }
        warp_max[lane] = w;
    }
    __syncthreads();
    const u32 before = max(prev, warp > 0 ? warp_max[warp - 1] : 0u);
    v.x = (unsigned short)max(before, a);
    v.y = (unsigned short)max(before, b);
    v.z = (unsigned short)max(before, c);
    v.w = (unsigned short)max(before, d);
    reinterpret_cast<ushort4*>(m)[threadIdx.x] = v;
    __syncthreads();
}

// Sum (MAX = false) or max over the block, in a fixed order: the same bits on every run.
template <bool MAX> __device__ __forceinline__ double block_reduce(double v, double* scratch) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        double w = __shfl_down_sync(0xffffffffu, v, o);
        v = MAX ? fmax(v, w) : v + w;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double s = 0.0;
    for (int w = 0; w < nwarps; ++w) s = MAX ? fmax(s, scratch[w]) : s + scratch[w];
    __syncthreads();
    return s;
}

// Sorts (key, row) entries [0..cap) ascending (cap a power of two), all threads of the block;
// `filt` (when not null) moves with them.
__device__ void bitonic_sort(u64* key, u32* row, float* filt, int cap) {
    for (int size = 2; size <= cap; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < (cap >> 1); i += blockDim.x) {
                int lo = 2 * stride * (i / stride) + (i % stride);
                int hi = lo + stride;
                bool asc = (lo & size) == 0;
                u64 ka = key[lo], kb = key[hi];
                u32 ra = row[lo], rb = row[hi];
                if (entry_less(kb, rb, ka, ra) == asc) {
                    key[lo] = kb;
                    row[lo] = rb;
                    key[hi] = ka;
                    row[hi] = ra;
                    if (filt) {
                        const float f = filt[lo];
                        filt[lo] = filt[hi];
                        filt[hi] = f;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// The running top-k of one block: `*count` entries, unsorted after the last compaction; entries
// not below (`*tau_key`, `*tau_row`) cannot enter. With a filter (`filt` not null), each entry's
// filter value rounded up to a float, and `*tau_filt` the k-th entry's.
__device__ void topk_compact(u64* key, u32* row, float* filt, int cap, int k, int* count,
                             u64* tau_key, u32* tau_row, float* tau_filt) {
    __syncthreads();
    int n = *count;
    for (int i = n + threadIdx.x; i < cap; i += blockDim.x) {
        key[i] = NO_KEY;
        row[i] = NO_ROW;
        if (filt) filt[i] = __int_as_float(0x7f800000);  // +inf
    }
    __syncthreads();
    bitonic_sort(key, row, filt, cap);
    if (threadIdx.x == 0) {
        int kept = n < k ? n : k;
        *count = kept;
        if (n >= k) {
            *tau_key = key[k - 1];
            *tau_row = row[k - 1];
            if (filt) *tau_filt = filt[k - 1];
        }
    }
    __syncthreads();
}

// Offers (key, row) to the running top-k; when `filt` is not null, with its filter value
// (`filter()`, computed only for an entry that gets in) rounded up to a float.
template <typename F>
__device__ __forceinline__ void topk_offer(u64* key, u32* row, float* filt, int* count,
                                           u64 tau_key, u32 tau_row, u64 c, u32 j,
                                           const F& filter) {
    if (entry_less(c, j, tau_key, tau_row)) {
        int slot = atomicAdd(count, 1);
        key[slot] = c;
        row[slot] = j;
        if (filt) filt[slot] = __double2float_ru(filter());
    }
}

// Writes a block's final top-k (after the last compaction) for work row `w`.
__device__ __forceinline__ void topk_write(const u64* key, const u32* row, int n, int w, int k,
                                           u32* out_rows, double* out_dist, int* out_count) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        out_rows[(size_t)w * k + i] = row[i];
        const double d = ordered_to_double(key[i]);
        out_dist[(size_t)w * k + i] = MetricDef::SIMILARITY ? -d : d;
    }
    if (threadIdx.x == 0) out_count[w] = n;
}

__device__ __forceinline__ void radius_emit(const double dist, const double radius, const int row,
                                            const int j, u64* counter, const u64 cap, u32* left,
                                            u32* right, double* out) {
    bool inside = MetricDef::SIMILARITY ? dist >= radius : dist <= radius;
    if (inside) {
        u64 slot = atomicAdd(counter, 1ull);
        if (slot < cap) {
            left[slot] = (u32)row;
            right[slot] = (u32)j;
            out[slot] = dist;
        }
    }
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

template <int I> __device__ __forceinline__ double pair_term(double x, double y, const Params& prm) {
    return I == 0 ? MetricDef::pair0(x, y, prm) : MetricDef::pair1(x, y, prm);
}

// A bound on |pair_I(x, y)| over the right side's values: every metric's pair terms are monotone
// in |y| on each sign, or reach their extreme at y = ±x (canberra, hamming), so the extremes of
// |y| in [y_min, y_max] (both signs) and y = ±|x| cover them. NaN (outside a metric's domain,
// e.g. a log of a negative y that validation excludes) is ignored by fmax.
template <int I> __device__ double term_bound(double x, double y_min, double y_max,
                                              const Params& prm) {
    const double ax = fabs(x);
    double b = 0.0;
    b = fmax(b, fabs(pair_term<I>(x, y_min, prm)));
    b = fmax(b, fabs(pair_term<I>(x, -y_min, prm)));
    b = fmax(b, fabs(pair_term<I>(x, y_max, prm)));
    b = fmax(b, fabs(pair_term<I>(x, -y_max, prm)));
    b = fmax(b, fabs(pair_term<I>(x, ax, prm)));
    b = fmax(b, fabs(pair_term<I>(x, -ax, prm)));
    return b;
}

// 2^s such that `deg` terms of at most twice `bound` sum below 2^62 once scaled.
__device__ __forceinline__ double fixed_scale(double bound, int deg) {
    double t = bound * 2.0 * (double)(deg > 0 ? deg : 1);
    if (!(t > 0.0) || isinf(t)) t = 1.0;
    int e;
    frexp(t, &e);  // t < 2^e
    e = max(e, -950);
    return ldexp(1.0, 62 - e);
}

// A max over the union (chebyshev) from the inverted lists: the largest |x - y| over the shared
// columns (`shared_max`), and the largest |x| over the left row's columns the right row lacks,
// which is the left row's first entry, by |x| descending, whose rank bit is not set in
// `ranks` (low word), likewise the right row's (high word); `top` holds each row's TOP_VALUES
// largest |values|, descending, zero past the row's end (so a row whose every entry is shared
// gives 0). When a row's 32 largest are all shared, its part is only known to be within
// [0, top[32]]: the lower end is taken; the host computes such pairs exactly (src/gpu/index.rs,
// the certified path).
__device__ __forceinline__ double max_pair(double shared_max, u64 ranks, const float* l_top,
                                           const float* r_top) {
    const u32 mx = (u32)ranks, my = (u32)(ranks >> 32);
    const int tx = mx == 0xffffffffu ? 32 : __ffs(~mx) - 1;
    const int ty = my == 0xffffffffu ? 32 : __ffs(~my) - 1;
    const double ax = tx < 32 ? (double)l_top[tx] : 0.0;
    const double ay = ty < 32 ? (double)r_top[ty] : 0.0;
    return fmax(shared_max, fmax(ax, ay));
}

// atomicAdd on a 64-bit word of shared memory compiles to a compare-and-swap loop on sm_90 (a
// load, ATOMS.CAST.SPIN.64, a compare and a branch, again whenever another thread changed the
// word in between). Two native 32-bit adds give the same sum: the low word's carry comes from the
// value its add returns, and the high word takes it with the term's high half. Each add that wraps
// the low word carries exactly once, so the word is the exact 64-bit sum (mod 2^64: negative
// terms too) once the block's adds are done; only a read during the adds could see halves apart,
// and the kernels read accumulators only after a barrier.
// The high word's add is not skipped when it adds 0: the terms are scaled towards 2^62 over the
// row's degree, so it rarely does, and the test and branch cost four instructions an entry.
__device__ __forceinline__ void shared_add_u64(long long* acc, u64 add) {
    u32* word = reinterpret_cast<u32*>(acc);  // little-endian: [0] low, [1] high
    const u32 lo = (u32)add;
    const u32 old = atomicAdd(word, lo);
    const u32 hi = (u32)(add >> 32) + (u32)(old + lo < old);
    atomicAdd(word + 1, hi);
}

// Adds `term` (scaled) to a fixed-point accumulator; false for a term beyond the bound, which
// adds nothing (the caller reports it). With `cbits` > 0 the sum sits above the low `cbits` bits,
// which count the terms added: a pair of rows sharing no column is told apart in the same atomic
// (the scale was lowered by 2^cbits to leave room, and the count, at most the left row's degree,
// stays below 2^cbits, so it never carries).
__device__ __forceinline__ bool fixed_add(long long* acc, double term, double scale,
                                          int cbits = 0) {
    const double v = term * scale;
    // No branch around the add: a branch lets the compiler load the entry's row only after its
    // value's check, one global load's latency after the other.
    const bool fits = fabs(v) <= ldexp(4.0e18, -cbits);
    const u64 add = fits ? (((u64)llrint(v)) << cbits) + (u64)(cbits != 0) : 0ull;
    shared_add_u64(acc, add);
    return fits;
}

// A reduced sum (or max) of the union's terms to a distance, as `union_distance` finishes it:
// with zero totals.
__device__ __forceinline__ double exact_finish(double reduced, const Params& prm) {
    const Totals zero = {0.0, 0.0};
    return MetricDef::finish(reduced, 0.0, zero, zero, prm);
}

// A pair of left work row `w` (chunk row `row`) and right row `j` that shares no column, in a
// bound mode given the one-sided sums: its reduced sum l_one + r_one (+ 0, as the exact step
// adds the shared terms' empty sum) is exact, and so is its distance when `finish` is correctly
// rounded (FINISH_EXACT); otherwise the key is that distance less 2^-40 of it, below the CPU's
// `pow` of the same sum. The metrics that take this path have a `finish` that does not decrease
// with the sum (`finish_increasing`), so a pair whose sum is above `*cut` (with a margin far over
// a `pow`'s rounding), the smallest sum of such a pair that was not selected, cannot be: its
// distance is not computed. `*cut` only falls and the k-th key only falls, so a stale read of it
// only costs a finish.
template <bool RADIUS>
__device__ __forceinline__ void disjoint_offer(const FoldedArgs& a, int w, int row, int j,
                                               const Params& prm, u64* cand_key, u32* cand_row,
                                               float* cand_filt, int* count, u64 tau_key,
                                               u32 tau_row, u64* cut) {
    const double sum = __dadd_rn(__dadd_rn(a.l_one[row], a.r_one[j]), 0.0);
    const u64 cut_key = *cut;
    if (cut_key != NO_KEY) {
        const double c = ordered_to_double(cut_key);
        if (sum > __dadd_rn(c, fabs(c) * 0x1p-30)) return;
    }
    double dist = exact_finish(sum, prm);
    if (!MetricDef::FINISH_EXACT) dist = __dsub_rn(dist, fabs(dist) * 0x1p-40);
    bool selected;
    if (RADIUS) {
        const double r = a.row_radius ? a.row_radius[w] : a.radius;
        selected = dist <= r;
        if (selected) {
            const u64 slot = atomicAdd(a.r_counter, 1ull);
            if (slot < a.r_cap) {
                a.r_left[slot] = (u32)row;
                a.r_right[slot] = (u32)j;
                a.r_dist[slot] = dist;
            }
        }
    } else {
        const u64 c = double_to_ordered(dist);
        selected = entry_less(c, (u32)j, tau_key, tau_row);
        if (selected) {
            const int slot = atomicAdd(count, 1);
            cand_key[slot] = c;
            cand_row[slot] = (u32)j;
            // (no filter value: a row whose filter is at least +inf is never skipped for it)
            if (cand_filt) cand_filt[slot] = __int_as_float(0x7f800000);
        }
    }
    if (!selected) atomicMin(cut, double_to_ordered(sum));
}

template <bool RADIUS> __device__ void folded_body(const FoldedArgs& a) {
    const int* l_off = a.l_off;
    const long long l_base = a.l_base;
    const int* l_idx = a.l_idx;
    const float* l_val = a.l_val;
    const int* work = a.work;
    const int nwork = a.nwork, n_right = a.n_right;
    const long long self_first = a.self_first;
    const u32* valid_bits = a.valid_bits;
    const double* rt0 = a.rt0;
    const double* rt1 = a.rt1;
    const int col_mode = a.col_mode, ncols = a.ncols;
    const int* col_ids = a.col_ids;
    const u32* tile_ptr = a.tile_ptr;
    const uint2* col_entries = a.col_entries;
    const int tile_rows = a.tile_rows, ntiles = a.ntiles;
    const Params prm = {a.p, a.d};
    const int k = a.k, cap = a.cap;
    const double radius = a.radius;
    const u64 r_cap = a.r_cap;
    extern __shared__ __align__(16) unsigned char smem[];
    const int B = blockDim.x;
    // A max (chebyshev) keeps per pair the largest shared |x - y| (acc0's low word: a float
    // rounded down, whose bits order as non-negative floats do) and which of both rows' 32
    // largest entries are shared (acc1: a bit per rank, the left row's low word, the right row's
    // high word); see `max_pair`.
    const bool MAXRED = METRIC_REDUCTION_MAX;
    const bool TWO = MetricDef::TWO || MAXRED;
    // A knn join of a metric with a filter (`MetricDef::filter`, from its KeyForm) finishes only
    // the rows whose filter value is below the k-th row's.
    const bool FILTERED = MetricDef::FILTER && !RADIUS;
    // Shared memory: acc0[tile] (acc1[tile]) | cand_key[cap] cand_row[cap] (knn) cand_filt[cap]
    // (filtered) | seg_walk[B] (8 bytes) seg_off[B] seg_rank[B] | seg_map[SEG_ITEMS * B] (u16)
    long long* acc0 = (long long*)smem;
    long long* acc1 = acc0 + tile_rows;
    u64* cand_key = (u64*)(acc0 + (TWO ? 2 : 1) * tile_rows);
    u32* cand_row = (u32*)(cand_key + (RADIUS ? 0 : cap));
    float* cand_filt = FILTERED ? (float*)(cand_row + cap) : nullptr;
    // What a work item reads of its segment, in one 8-byte load: the distance from its flattened
    // index to its entry in the lists (start - offset, modulo 2^32) and the left value's bits.
    // cap is a power of two (or 0), so this stays 8-byte aligned.
    uint2* seg_walk = (uint2*)(cand_row + (RADIUS ? 0 : cap) + (FILTERED ? cap : 0));
    u32* seg_off = (u32*)(seg_walk + B);
    u32* seg_rank = seg_off + B;
    unsigned short* seg_map = (unsigned short*)(seg_rank + B);
    __shared__ u32 warp_sums[32];
    // Each segment's left value's lift (`MetricDef::lift`), for a lifted metric's pairs.
    __shared__ double seg_lift[MetricDef::LIFTED ? FOLDED_THREADS : 1];
    __shared__ double red[32];
    __shared__ int s_count;
    __shared__ u64 s_tau_key;
    __shared__ u32 s_tau_row;
    __shared__ float s_tau_filt;
    __shared__ double s_l_norm;
    // Rows whose sum is 0 (no shared column, for most pairs of sparse rows): where the metric's
    // distance at sum 0 is one constant (`zero_skip`: dot, cosine), they tie in row order, so
    // only the first k of them can be among the k nearest, and for a radius either all or none
    // are within it: the rest are not finished at all.
    __shared__ int s_zeros;
    // Pairs sharing no column, where the kernels take them (`disjoint` below): the smallest
    // one-sided sum of such a pair found not to be selected, as an ordered key; none above it can be.
    __shared__ u64 s_cut;

    // The accumulators start at zero and every tile's finishing pass puts each entry it reads
    // back to zero, so a tile needs no zeroing pass of its own (only the dense product's start).
    for (int j = threadIdx.x; j < (TWO ? 2 : 1) * tile_rows; j += B) acc0[j] = 0;

    for (int w = blockIdx.x; w < nwork; w += gridDim.x) {
        const int row = work[w];
        const long long start = (long long)l_off[row] - l_base;
        const long long end = (long long)l_off[row + 1] - l_base;
        const int deg = (int)(end - start);
        const long long self_row = self_first != NO_SELF ? self_first + row : -1;

        // Left totals in float64 and the fixed-point scales, each a block reduction in a fixed
        // order (every thread takes a strided part).
        double t0 = 0.0, t1 = 0.0, b0 = 0.0, b1 = 0.0;
        for (int e = threadIdx.x; e < deg; e += B) {
            float x = l_val[start + e];
            if (x != 0.0f) {
                t0 += MetricDef::total0((double)x, prm);
                t1 += MetricDef::total1((double)x, prm);
                b0 = fmax(b0, term_bound<0>((double)x, a.y_min, a.y_max, prm));
                if (TWO) b1 = fmax(b1, term_bound<1>((double)x, a.y_min, a.y_max, prm));
            }
        }
        const double lt0 = block_reduce<false>(t0, red);
        const double lt1 = block_reduce<false>(t1, red);
        // Bound modes that leave disjoint pairs to the host count each pair's shared columns in
        // the low bits of its accumulator (deg < 2^cbits).
        const int cbits =
            (CERTIFIED_PROBES && a.shared_only && a.lower_bounds) ? 32 - __clz(deg | 1) : 0;
        const double scale0 = ldexp(fixed_scale(block_reduce<true>(b0, red), deg), -cbits);
        const double scale1 = TWO ? fixed_scale(block_reduce<true>(b1, red), deg) : 1.0;
        if (threadIdx.x == 0) {
            // A quotient filter's left factor, read by the finishing passes from shared memory:
            // in a register it would live through the walk, which has none to spare (four
            // blocks a SM).
            s_l_norm = sqrt(lt0);
            s_count = 0;
            s_tau_key = NO_KEY;
            s_tau_row = NO_ROW;
            s_zeros = 0;
            s_cut = NO_KEY;
        }
        __syncthreads();
        // Eligible rows of sum 0 offered so far (read between the barriers of each round, so
        // every thread of the block holds the same count).
        int zeros_seen = 0;
        const double zero_radius = RADIUS ? (a.row_radius ? a.row_radius[w] : radius) : 0.0;
        const bool zeros_outside = RADIUS
            && !(MetricDef::SIMILARITY ? a.zero_dist >= zero_radius : a.zero_dist <= zero_radius);

        // This block's group of tiles (all of them unless the launch cut them: few left rows).
        const int t_end = (int)((long long)ntiles * (blockIdx.y + 1) / a.tile_groups);
        for (int t = (int)((long long)ntiles * blockIdx.y / a.tile_groups); t < t_end; ++t) {
            const int tile_first = t * tile_rows;
            const int tile_len = min(tile_rows, n_right - tile_first);
            // The dense columns' part of the sum, from the tensor-core product (`dense_gemm`):
            // a bilinear pair (c·x·y) summed over them is pair0(g, 1) for their dot product g.
            const float* dense_row =
                a.dense ? a.dense + (size_t)row * (size_t)a.dense_stride + tile_first : nullptr;
            if (dense_row) {
                for (int j = threadIdx.x; j < tile_len; j += B) {
                    const double g = (double)dense_row[j];
                    if (g != 0.0) {
                        const double v = MetricDef::pair0(g, 1.0, prm) * scale0;
                        if (fabs(v) <= 4.0e18) acc0[j] = llrint(v); else *a.overflow = 1u;
                    }
                }
            }
            __syncthreads();
            // Accumulate, a chunk of B left nonzeros at a time.
            for (int c0 = 0; c0 < deg; c0 += B) {
                u32 len = 0, sstart = 0, rank = 255;
                float x = 0.0f;
                int e = c0 + threadIdx.x;
                if (e < deg) {
                    x = l_val[start + e];
                    if (MAXRED) rank = a.l_rank[start + e];
                    int col = x != 0.0f ? map_column(l_idx[start + e], col_mode, ncols, col_ids) : -1;
                    // Dense columns came from the tensor-core product.
                    if (col >= 0 && a.dense && a.dense_slot[col] >= 0) col = -1;
                    if (col >= 0) {
                        const u32* tp = tile_ptr + (size_t)col * (ntiles + 1) + t;
                        sstart = tp[0];
                        len = tp[1] - sstart;
                    }
                }
                u32 total;
                u32 off = block_exclusive_scan(len, warp_sums, &total);
                seg_walk[threadIdx.x] = make_uint2(sstart - off, __float_as_uint(x));
                if (MetricDef::LIFTED && !MAXRED)
                    seg_lift[threadIdx.x] = x != 0.0f ? MetricDef::lift((double)x, prm) : 0.0;
                seg_off[threadIdx.x] = off;
                if (MAXRED) seg_rank[threadIdx.x] = rank;  // only a max reads the ranks
                __syncthreads();
                const int nseg = min(B, deg - c0);
                // One work item: entry `pos` of the right side's lists, in segment `lo`.
                auto walk = [&](u32 q, int lo) {
                    const uint2 seg = seg_walk[lo];
                    const u32 pos = q + seg.x;
                    const uint2 entry = col_entries[pos];  // (row, value bits)
                    int j = (int)entry.x - tile_first;
                    const double x = __uint_as_float(seg.y), y = __uint_as_float(entry.y);
                    if (MAXRED) {
                        // Native 32-bit shared atomics (a 64-bit max or or is a compare-and-swap
                        // loop on sm_90): the term rounded down to a float, a lower bound as the
                        // certified path needs (exact for differences a float holds: counts).
                        const float term = __double2float_rd(MetricDef::pair0(x, y, prm));
                        atomicMax(reinterpret_cast<u32*>(&acc0[j]), __float_as_uint(term));
                        u32* ranks = reinterpret_cast<u32*>(&acc1[j]);  // [0] left, [1] right
                        const u32 rx = seg_rank[lo], ry = a.col_ranks[pos];
                        if (rx < 32) atomicOr(ranks, 1u << rx);
                        if (ry < 32) atomicOr(ranks + 1, 1u << ry);
                    } else {
                        // (the left value's lift, computed once for its segment, and the right
                        // value's, once for its posting (`entry_lifts`): the same bits `pair0`
                        // computes in place)
                        const double lx = MetricDef::LIFTED ? seg_lift[lo] : 0.0;
                        const double ly = MetricDef::LIFTED ? a.col_lift[pos] : 0.0;
                        bool fits = fixed_add(&acc0[j], MetricDef::pair0_lifted(x, lx, y, ly, prm),
                                              scale0, cbits);
                        if (TWO)
                            fits &= fixed_add(&acc1[j],
                                              MetricDef::pair1_lifted(x, lx, y, ly, prm), scale1);
                        if (!fits) *a.overflow = 1u;
                    }
                };
                // Work item q of the flattened chunk belongs to the last segment with seg_off <= q.
                if ((total >= SEG_MAP_MIN_ITEMS && (u32)nseg > SEG_MAP_MIN_SEGMENTS)
                    || (total >= SEG_MAP_MIN_ITEMS_2 && (u32)nseg > SEG_MAP_MIN_SEGMENTS_2)) {
                    // Several rounds over many segments (by default): each item's segment from a
                    // map, SEG_ITEMS * B items at a time (every non-empty segment marks its first
                    // item, a block-wide max-scan fills in the rest): a few instructions an item,
                    // where a binary search over the segments takes up to 9 dependent
                    // shared-memory steps (the kernels are issue-bound, integer ALU the busiest
                    // pipe: calls O and AO).
                    const u32 win = SEG_ITEMS * (u32)B;
                    u32 carry = 0;
                    for (u32 w0 = 0; w0 < total; w0 += win) {
                        for (u32 i = threadIdx.x; i < win; i += B) seg_map[i] = 0;
                        __syncthreads();
                        if (len > 0 && off >= w0 && off - w0 < win)
                            seg_map[off - w0] = (unsigned short)(threadIdx.x + 1);
                        __syncthreads();
                        block_max_scan(seg_map, carry, warp_sums);
                        const u32 wlen = min(win, total - w0);
                        for (u32 i = threadIdx.x; i < wlen; i += B) walk(w0 + i, (int)seg_map[i] - 1);
                        carry = seg_map[wlen - 1];
                        __syncthreads();
                    }
                } else {
                    // Otherwise a binary search in shared memory. (Tried on the device: one
                    // broadcast search per warp-group of 32 items instead was 10% slower on scrna.)
                    for (u32 q = threadIdx.x; q < total; q += B) {
                        int lo = 0, hi = nseg - 1;
                        while (lo < hi) {
                            int mid = (lo + hi + 1) >> 1;
                            if (seg_off[mid] <= q) lo = mid; else hi = mid - 1;
                        }
                        walk(q, lo);
                    }
                }
                __syncthreads();
            }
            // Finish every right row of the tile and select.
            for (int f0 = 0; f0 < tile_len; f0 += B) {
                int jj = f0 + threadIdx.x;
                if (jj < tile_len) {
                    int j = tile_first + jj;
                    const long long word0 = acc0[jj];
                    const long long word1 = TWO ? acc1[jj] : 0;
                    acc0[jj] = 0;
                    if (TWO) acc1[jj] = 0;
                    long long raw0 = word0;
                    const bool counted = cbits == 0 || (raw0 & ((1ll << cbits) - 1)) != 0;
                    raw0 >>= cbits;
                    // A pair sharing no column, when the probe gave the rows' one-sided sums
                    // (`r_one`, `l_one`: the exact step's own, src/gpu/index/exact.rs): its exact
                    // reduced sum is theirs, finished here. The host pass that found such pairs
                    // from those sums walked every right row for a left row sharing a column with
                    // nearly all of them.
                    const bool disjoint = CERTIFIED_PROBES && !METRIC_REDUCTION_MAX && !counted
                                          && a.r_one != nullptr;
                    // Most rows of sum 0 are past the first k (or outside the radius): they are
                    // dropped before their valid bit is read.
                    const bool zero = a.zero_skip && raw0 == 0;
                    bool take = (counted || disjoint)
                                && !(zero && (RADIUS ? zeros_outside : zeros_seen >= k))
                                && (!valid_bits || row_valid(valid_bits, j)) && (long long)j != self_row
                                && (a.r_group == nullptr || a.r_group[j] == a.l_group[row]);
                    if (take && zero && !RADIUS) atomicAdd(&s_zeros, 1);
                    if (take && disjoint) {
                        disjoint_offer<RADIUS>(a, w, row, j, prm, cand_key, cand_row, cand_filt,
                                               &s_count, s_tau_key, s_tau_row, &s_cut);
                        take = false;
                    }
                    if (take) {
                        double s0 = (double)raw0 / scale0;
                        const double s1 = TWO && !MAXRED ? (double)word1 / scale1 : 0.0;
                        if (MAXRED) {
                            s0 = max_pair((double)__uint_as_float((u32)word0), (u64)word1,
                                          a.l_top + (size_t)w * TOP_VALUES,
                                          a.r_top + (size_t)j * TOP_VALUES);
                        } else if (CERTIFIED_PROBES && a.lower_bounds) {
                            // The folded sum's rounding, bounded as in src/cpu/certified.rs (n
                            // terms, each within a few ulps of its parts, whose sum is at most
                            // |acc| + 2(L + R)), plus the fixed-point rounding of each term.
                            const double e = 2.0 * (double)(deg + a.max_row_len + 8) * DBL_EPS
                                                 * MetricDef::ROUNDING_GROWTH
                                                 * (fabs(s0) + 3.0 * (fabs(lt0) + fabs(rt0[j])))
                                             + (double)deg / scale0;
                            s0 -= e;
                        }
                        bool wanted = true;
                        if (FILTERED && s_tau_key != NO_KEY) {
                            // Not below the k-th row's filter (rounded up): not nearer than it,
                            // and rows arrive in increasing order, so a tie does not displace it
                            // either (the CPU's rule, `select_nearest` in src/cpu/folded.rs).
                            wanted = !MetricDef::filter_at_least(
                                s0, lt0, s_l_norm, a.key_base ? a.key_base[j] : 0.0,
                                (double)s_tau_filt);
                        }
                        if (wanted) {
                            const Totals lt = {lt0, lt1};
                            const Totals rt = {MetricDef::NEEDS_RT0 ? rt0[j] : 0.0,
                                               MetricDef::NEEDS_RT1 ? rt1[j] : 0.0};
                            const double dist = MetricDef::finish(s0, s1, lt, rt, prm);
                            if (RADIUS) {
                                const double r = a.row_radius ? a.row_radius[w] : radius;
                                radius_emit(dist, r, row, j, a.r_counter, r_cap, a.r_left,
                                            a.r_right, a.r_dist);
                            } else {
                                const u64 c =
                                    double_to_ordered(MetricDef::SIMILARITY ? -dist : dist);
                                topk_offer(cand_key, cand_row, cand_filt, &s_count, s_tau_key,
                                           s_tau_row, c, (u32)j, [&] {
                                               return MetricDef::filter(
                                                   s0, lt0, s_l_norm,
                                                   a.key_base ? a.key_base[j] : 0.0);
                                           });
                            }
                        }
                    }
                }
                if (!RADIUS) {
                    __syncthreads();
                    // At most B entries arrive per round: compact before the buffer can overflow.
                    // Every thread reads the count before any thread can add to it again. (One
                    // barrier counting the offers and zeros, __syncthreads_count, made the
                    // kernels spill under the four-block bound.)
                    const int cnt = s_count;
                    zeros_seen = s_zeros;
                    __syncthreads();
                    if (cnt > cap - B)
                        topk_compact(cand_key, cand_row, cand_filt, cap, k, &s_count, &s_tau_key,
                                     &s_tau_row, &s_tau_filt);
                }
            }
            __syncthreads();
        }
        if (!RADIUS) {
            topk_compact(cand_key, cand_row, cand_filt, cap, k, &s_count, &s_tau_key, &s_tau_row,
                         &s_tau_filt);
            topk_write(cand_key, cand_row, s_count, (int)blockIdx.y * nwork + w, k, a.out_rows,
                       a.out_dist, a.out_count);
            __syncthreads();
        }
    }
}

// A lifted metric's lift of every entry of the right side's inverted lists, which the folded
// kernels read beside the entry (`col_lift`): computed once per posting here rather than once
// per pair there (a logarithm a pair: jensenshannon 2.85x manhattan's time at movielens_full).
extern "C" __global__ void entry_lifts(const uint2* entries, double* lifts, const long long n,
                                       const double p, const double d) {
    const Params prm = {p, d};
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        lifts[i] = MetricDef::lift((double)__uint_as_float(entries[i].y), prm);
}

// Four blocks a SM for the metrics that fit 32 registers, three for the lifted ones
// (`kernels::folded_min_blocks`); no bound for the others: a bound of one block lets the compiler
// take 70 registers, and one block runs.
#if FOLDED_MIN_BLOCKS > 0
#define FOLDED_BOUNDS __launch_bounds__(FOLDED_THREADS, FOLDED_MIN_BLOCKS)
#else
#define FOLDED_BOUNDS
#endif
extern "C" __global__ void FOLDED_BOUNDS folded_knn(const FoldedArgs a) { folded_body<false>(a); }
extern "C" __global__ void FOLDED_BOUNDS folded_radius(const FoldedArgs a) { folded_body<true>(a); }

