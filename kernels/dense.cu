// Part of the module src/gpu/kernels.rs assembles, right after knn.cu (whose types and helpers it
// uses): the dense columns on the tensor cores and the inverted lists built on the device.
// ---------------------------------------------------------------------------------------------
// Dense columns on the tensor cores (dot, cosine). The right side's densest columns are also kept
// as a dense block B (right rows x kp, row-major); a launch scatters its left rows' values in
// those columns into A (rows x kp) and `dense_gemm` computes C = A·Bᵀ, which the folded kernels
// take as each pair's starting sum (the inverted lists of those columns are skipped).
// Operands: where every value of both is an integer of magnitude at most 127 (small counts), as
// 8-bit integers summed exactly in 32-bit integers (m16n8k32, the fastest form); where every
// value is an integer of magnitude at most 2048 (raw counts), as half precision, whose products
// are exact (m16n8k16); otherwise as TF32,
// which keeps 10 of float32's 23 mantissa bits, so an operand whose values are not all TF32
// numbers is split into hi + lo parts and the product taken as hi·hi + hi·lo + lo·hi (3xTF32:
// float32 accuracy). Tensor cores add in float32 with truncation; their sums are moved into a
// float32 running sum (rounded to nearest) every DENSE_FLUSH columns.

// DG_BM, DG_BN (the block's tile of C), DG_LD (32-bit words per padded tile row: 32 words of k,
// i.e. 32 floats, 64 halves or 128 bytes, plus 4), the value flags DENSE_NOT_TF32 (not a TF32
// number), DENSE_NOT_HALF (not an integer of magnitude <= 2048), DENSE_NOT_INT8 (<= 127), and
// the fast copies' kinds DENSE_FAST_HALF, DENSE_FAST_INT8 are defined from src/gpu/prepare.rs
// (`dense_defines`).
#define DG_BKW 32
#define DG_STAGE_WORDS ((DG_BM + DG_BN) * DG_LD)
#define DENSE_FLUSH 64

__device__ __forceinline__ u32 dense_flags(float v) {
    u32 f = (__float_as_uint(v) & 0x1fffu) ? DENSE_NOT_TF32 : 0u;
    const bool whole = v == rintf(v);
    if (!(whole && fabsf(v) <= 2048.0f)) f |= DENSE_NOT_HALF;
    if (!(whole && fabsf(v) <= 127.0f)) f |= DENSE_NOT_INT8;
    return f;
}

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ unsigned short to_half(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}
#endif

// Left rows' values in the dense columns, into A and its fast copy (both zeroed before): a warp
// per row. ORs every value's flags into `a_flags`.
extern "C" __global__ void dense_scatter(const DenseArgs a) {
#if __CUDA_ARCH__ >= 800
    const int lane = threadIdx.x & 31;
    const int warps = gridDim.x * (blockDim.x >> 5);
    u32 flags = 0;
    for (int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < a.rows; r += warps) {
        const long long s = (long long)a.l_off[r] - a.l_base;
        const long long e = (long long)a.l_off[r + 1] - a.l_base;
        for (long long i = s + lane; i < e; i += 32) {
            const float v = a.l_val[i];
            if (v == 0.0f) continue;
            const int col = map_column(a.l_idx[i], a.col_mode, a.ncols, a.col_ids);
            if (col < 0) continue;
            const int slot = a.dense_slot[col];
            if (slot < 0) continue;
            const size_t at = (size_t)r * a.kp + slot;
            a.a[at] = v;
            if (a.fast_kind == DENSE_FAST_HALF) ((unsigned short*)a.a_fast)[at] = to_half(v);
            if (a.fast_kind == DENSE_FAST_INT8) ((signed char*)a.a_fast)[at] = (signed char)(int)v;
            flags |= dense_flags(v);
        }
    }
    if (flags) atomicOr(a.a_flags, flags);
#endif
}

// The right part's dense block B (and its fast copy when it has one), zeroed before, from the
// dense columns' inverted lists already on the device: a warp per column.
extern "C" __global__ void dense_fill(const DenseFillArgs a) {
#if __CUDA_ARCH__ >= 800
    const int lane = threadIdx.x & 31;
    const int warps = gridDim.x * (blockDim.x >> 5);
    for (int c = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); c < a.ncols; c += warps) {
        const int slot = a.dense_slot[c];
        if (slot < 0) continue;
        const u32* tp = a.tile_ptr + (size_t)c * (a.ntiles + 1);
        for (u32 pos = tp[0] + lane; pos < tp[a.ntiles]; pos += 32) {
            const uint2 entry = a.col_entries[pos];
            const size_t at = (size_t)entry.x * a.kp + slot;
            const float v = __uint_as_float(entry.y);
            a.b[at] = v;
            if (a.fast_kind == DENSE_FAST_HALF) ((unsigned short*)a.b_fast)[at] = to_half(v);
            if (a.fast_kind == DENSE_FAST_INT8) ((signed char*)a.b_fast)[at] = (signed char)(int)v;
        }
    }
#endif
}

// The right part's inverted lists built on the device from its CSR (src/gpu/lists.rs): each
// (column, tile)'s entries counted, the counts scanned into the tile pointers, then each entry
// placed at its (column, tile)'s cursor. Inside a tile's segment entries land in any order: the
// folded kernels add integers and take maxima, and `dense_fill` writes each entry's own slot,
// so no result depends on it. A warp per row. A null row's range (which a struct's null slot may
// keep) is left out, as the host's build leaves it; a column outside the map (none, for a valid
// row) is left out too, and the host then reports the count that differs.
//
// `each(counter, r, e)` for every entry that belongs in the lists (a nonzero of a valid row, in a
// mapped column) with its (column, tile) counter: the count and the fill walk the same entries.
template <typename F>
__device__ __forceinline__ void list_entries(const ListArgs& a, const F& each) {
    const int lane = threadIdx.x & 31, warps = gridDim.x * (blockDim.x >> 5);
    for (int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < a.rows; r += warps) {
        if (a.valid_bits && !row_valid(a.valid_bits, r)) continue;
        for (u32 e = a.r_off[r] + lane; e < a.r_off[r + 1]; e += 32) {
            if (a.r_val[e] == 0.0f) continue;
            const int col = map_column(a.r_idx[e], a.col_mode, a.ncols, a.col_ids);
            if (col >= 0) each(a.cursor + (size_t)col * (a.ntiles + 1) + r / a.tile_rows, r, e);
        }
    }
}

extern "C" __global__ void list_count(const ListArgs a) {
    list_entries(a, [](u32* counter, int, u32) { atomicAdd(counter, 1u); });
}

// The exclusive scan of the n counts (column-major, ntiles + 1 a column, the last always 0, so
// that it becomes the column's end): LIST_SCAN_ITEMS a thread, a block's sum each, ...
#define LIST_SCAN_ITEMS 4
extern "C" __global__ void list_scan_sums(const ListArgs a) {
    __shared__ u32 warp_sums[32];
    const size_t first = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * LIST_SCAN_ITEMS;
    u32 sum = 0;
    for (int i = 0; i < LIST_SCAN_ITEMS; ++i)
        if (first + i < (size_t)a.n) sum += a.cursor[first + i];
    u32 total;
    block_exclusive_scan(sum, warp_sums, &total);
    if (threadIdx.x == 0) a.block_sums[blockIdx.x] = total;
}

// ... the blocks' sums scanned in place by one block, ...
extern "C" __global__ void list_scan_blocks(const ListArgs a) {
    __shared__ u32 warp_sums[32];
    u32 carry = 0;
    for (u32 b0 = 0; b0 < (u32)a.nblocks; b0 += blockDim.x) {
        const u32 b = b0 + threadIdx.x;
        const u32 v = b < (u32)a.nblocks ? a.block_sums[b] : 0u;
        u32 total;
        const u32 before = block_exclusive_scan(v, warp_sums, &total);
        if (b < (u32)a.nblocks) a.block_sums[b] = carry + before;
        carry += total;
    }
}

// ... and every count replaced by its prefix, in the tile pointers and in the fill's cursors.
extern "C" __global__ void list_scan_apply(const ListArgs a) {
    __shared__ u32 warp_sums[32];
    const size_t first = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * LIST_SCAN_ITEMS;
    u32 v[LIST_SCAN_ITEMS], sum = 0;
    for (int i = 0; i < LIST_SCAN_ITEMS; ++i) {
        v[i] = first + i < (size_t)a.n ? a.cursor[first + i] : 0u;
        sum += v[i];
    }
    u32 total;
    u32 at = a.block_sums[blockIdx.x] + block_exclusive_scan(sum, warp_sums, &total);
    for (int i = 0; i < LIST_SCAN_ITEMS; ++i) {
        if (first + i < (size_t)a.n) {
            a.tile_ptr[first + i] = at;
            a.cursor[first + i] = at;
        }
        at += v[i];
    }
}

extern "C" __global__ void list_fill(const ListArgs a) {
    list_entries(a, [&](u32* counter, int r, u32 e) {
        const u32 pos = atomicAdd(counter, 1u);
        a.col_entries[pos] = make_uint2((u32)r, __float_as_uint(a.r_val[e]));
        if (a.col_ranks) a.col_ranks[pos] = a.r_rank[e];
    });
}

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ u32 to_tf32(u32 bits) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(__uint_as_float(bits)));
    return r;
}

// A float's TF32 part and, when `split`, the TF32 part of what it leaves (else 0).
__device__ __forceinline__ void split_tf32(u32 bits, bool split, u32* hi, u32* lo) {
    *hi = to_tf32(bits);
    *lo = split ? to_tf32(__float_as_uint(__uint_as_float(bits) - __uint_as_float(*hi))) : 0u;
}

__device__ __forceinline__ void mma_tf32(float* c, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma_f16(float* c, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma_s8(float* c, const u32* a, const u32* b) {
    // The accumulators hold 32-bit integers in this mode (the same registers, reinterpreted).
    int d0 = __float_as_int(c[0]), d1 = __float_as_int(c[1]);
    int d2 = __float_as_int(c[2]), d3 = __float_as_int(c[3]);
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d0), "+r"(d1), "+r"(d2), "+r"(d3)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    c[0] = __int_as_float(d0);
    c[1] = __int_as_float(d1);
    c[2] = __int_as_float(d2);
    c[3] = __int_as_float(d3);
}

__device__ __forceinline__ void cp_async16(u32* smem, const void* gmem) {
    unsigned s;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
#endif

// C (m_pad x n_pad, float32) = A (m_pad x kp) · B (n_pad x kp)ᵀ. A block computes 128 x 128 of C
// with 8 warps of 64 x 32; tiles of 128 bytes of k per row (32 TF32 or 64 half columns) are
// copied into shared memory (cp.async, two stages) while the previous one is multiplied. Both
// operand kinds share one shared-memory layout of 32-bit words, and the same words feed the
// m16n8k8 TF32 and the m16n8k16 half fragments (a word holds one TF32 column or two half ones).
extern "C" __global__ void __launch_bounds__(256, 1) dense_gemm(const DenseArgs a) {
#if __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) u32 dg_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
    const size_t m0 = (size_t)blockIdx.y * DG_BM, n0 = (size_t)blockIdx.x * DG_BN;
    const u32 af = *a.a_flags, bf = (u32)a.b_flags;
    // The fast copies when both operands have them (B's kind is known; A's values must fit it).
    const bool int8 = a.fast_kind == DENSE_FAST_INT8 && !((af | bf) & DENSE_NOT_INT8);
    const bool half = a.fast_kind == DENSE_FAST_HALF && !((af | bf) & DENSE_NOT_HALF);
    const bool fast = int8 || half;
    const bool a_lo = !fast && (af & DENSE_NOT_TF32);
    const bool b_lo = !fast && (bf & DENSE_NOT_TF32);
    const size_t row_bytes = (size_t)a.kp * (int8 ? 1 : half ? 2 : 4);
    const char* A = fast ? (const char*)a.a_fast : (const char*)a.a;
    const char* Bm = fast ? (const char*)a.b_fast : (const char*)a.b;
    const int nk = (int)(row_bytes / 128);
    // Tiles of DENSE_FLUSH columns between moves into the running sums (integer sums are exact:
    // they stay in the accumulators).
    const int flush_every = half ? 1 : 2;

    float acc[4][4][4], sum[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                acc[i][j][q] = 0.0f;
                sum[i][j][q] = 0.0f;
            }

    // A stage: A's 128 rows then B's, each DG_LD words; 8 chunks of 16 bytes per row.
    auto load = [&](int stage, int kt) {
        u32* st = dg_smem + stage * DG_STAGE_WORDS;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int f = tid + i * 256, row = f >> 3, ch = f & 7;
            const char* src = row < DG_BM
                ? A + (m0 + row) * row_bytes + (size_t)kt * 128 + ch * 16
                : Bm + (n0 + row - DG_BM) * row_bytes + (size_t)kt * 128 + ch * 16;
            cp_async16(st + row * DG_LD + ch * 4, src);
        }
        asm volatile("cp.async.commit_group;");
    };
    load(0, 0);
    for (int kt = 0; kt < nk; ++kt) {
        if (kt + 1 < nk) {
            load((kt + 1) & 1, kt + 1);
            asm volatile("cp.async.wait_group 1;");
        } else {
            asm volatile("cp.async.wait_group 0;");
        }
        __syncthreads();
        const u32* As = dg_smem + (kt & 1) * DG_STAGE_WORDS;
        const u32* Bs = As + DG_BM * DG_LD;
#pragma unroll
        for (int kw = 0; kw < DG_BKW; kw += 8) {
            u32 aw[4][4], bw[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u32* p = As + (wm + i * 16 + g) * DG_LD + kw + t;
                aw[i][0] = p[0];
                aw[i][1] = p[8 * DG_LD];
                aw[i][2] = p[4];
                aw[i][3] = p[8 * DG_LD + 4];
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const u32* p = Bs + (wn + j * 8 + g) * DG_LD + kw + t;
                bw[j][0] = p[0];
                bw[j][1] = p[4];
            }
            if (int8) {
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) mma_s8(acc[i][j], aw[i], bw[j]);
            } else if (half) {
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) mma_f16(acc[i][j], aw[i], bw[j]);
            } else {
                u32 ah[4][4], al[4][4], bh[4][2], bl[4][2];
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int q = 0; q < 4; ++q) split_tf32(aw[i][q], a_lo, &ah[i][q], &al[i][q]);
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int q = 0; q < 2; ++q) split_tf32(bw[j][q], b_lo, &bh[j][q], &bl[j][q]);
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        // The small parts first, then hi·hi.
                        if (a_lo) mma_tf32(acc[i][j], al[i], bh[j]);
                        if (b_lo) mma_tf32(acc[i][j], ah[i], bl[j]);
                        mma_tf32(acc[i][j], ah[i], bh[j]);
                    }
            }
        }
        if (!int8 && ((kt + 1) % flush_every == 0 || kt + 1 == nk)) {
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        sum[i][j][q] += acc[i][j][q];
                        acc[i][j][q] = 0.0f;
                    }
        }
        __syncthreads();
    }
    if (int8) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int q = 0; q < 4; ++q) sum[i][j][q] = (float)__float_as_int(acc[i][j][q]);
    }
    // c0, c1: row g, columns 2t, 2t + 1; c2, c3: row g + 8.
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const size_t row = m0 + wm + i * 16 + g, col = n0 + wn + j * 8 + 2 * t;
            float* out = a.c + row * (size_t)a.n_pad + col;
            *(float2*)out = make_float2(sum[i][j][0], sum[i][j][1]);
            *(float2*)(out + 8 * (size_t)a.n_pad) = make_float2(sum[i][j][2], sum[i][j][3]);
        }
#endif
}
