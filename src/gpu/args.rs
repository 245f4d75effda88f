//! Kernel parameters: one `#[repr(C)]` struct per kernel family, passed by value. The CUDA
//! declaration of each struct is generated from the Rust one (field names, C types, and
//! `static_assert`s of every field's size and alignment and of the total size), so the two cannot
//! drift: NVRTC refuses to compile a module whose layout differs, and CI compiles every module.

use cudarc::driver::DeviceRepr;

/// A device address (`CUdeviceptr`); typed on the CUDA side.
pub(crate) type DevPtr = u64;

macro_rules! kernel_args {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident : $rty:ty = $cty:literal),* $(,)? }) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, Default)]
        pub(crate) struct $name {
            $($(#[$fdoc])* pub $field: $rty),*
        }

        // SAFETY: a plain `#[repr(C)]` struct of integers and floats, mirrored field by field
        // (with checked offsets) by the CUDA declaration below.
        unsafe impl DeviceRepr for $name {}

        impl $name {
            /// The CUDA declaration, with layout checks.
            pub(crate) fn cuda_declaration() -> String {
                let mut s = format!("struct {} {{\n", stringify!($name));
                $(s += &format!("    {} {};\n", $cty, stringify!($field));)*
                s += "};\n";
                // NVRTC has no offsetof; with the C layout rules on both sides, equal sizes and
                // alignments of every field (in order) and an equal total size fix every offset.
                $(s += &format!(
                    "static_assert(sizeof(decltype((({name}*)0)->{field})) == {size} && \
                     alignof(decltype((({name}*)0)->{field})) == {align}, \
                     \"{name}.{field}: layout differs from src/gpu/args.rs\");\n",
                    name = stringify!($name),
                    field = stringify!($field),
                    size = std::mem::size_of::<$rty>(),
                    align = std::mem::align_of::<$rty>(),
                );)*
                s += &format!(
                    "static_assert(sizeof({}) == {}, \"{}: size differs from src/gpu/args.rs\");\n",
                    stringify!($name),
                    std::mem::size_of::<$name>(),
                    stringify!($name),
                );
                s
            }
        }
    };
}

kernel_args! {
    /// The folded kernels (`folded_knn`, `folded_radius`).
    FoldedArgs {
        /// Left chunk: CSR row pointer (absolute offsets of the Arrow buffer) and its base.
        l_off: DevPtr = "const int*",
        l_base: i64 = "long long",
        l_idx: DevPtr = "const int*",
        l_val: DevPtr = "const float*",
        /// Left rows (of the chunk) to compute, and how many.
        work: DevPtr = "const int*",
        nwork: i32 = "int",
        n_right: i32 = "int",
        /// Right row skipped for left row `r`: `self_first + r`, or NO_SELF.
        self_first: i64 = "long long",
        /// A bit per valid right row, or 0 (null) when every row is valid.
        valid_bits: DevPtr = "const u32*",
        /// Right totals (float64).
        rt0: DevPtr = "const double*",
        rt1: DevPtr = "const double*",
        /// The right rows' filter bases (`MetricDef::filter`): `rt0` itself, or √t0 for a
        /// quotient key; 0 (null) when the metric has no filter.
        key_base: DevPtr = "const double*",
        /// The smallest and largest |y| of the part's nonzeros: they bound the pair terms, which
        /// sets each left row's fixed-point scale.
        y_min: f64 = "double",
        y_max: f64 = "double",
        /// Set when a pair term exceeds its bound (the sums would be wrong).
        overflow: DevPtr = "u32*",
        /// 0: distances as computed; 1: their lower bounds (the folded sum shifted down by its
        /// proven rounding error, or a max's lower end; see `probe_certified` in
        /// src/gpu/index.rs).
        lower_bounds: i32 = "int",
        /// The most nonzeros of one right row (in the rounding bound).
        max_row_len: i32 = "int",
        /// Bound modes: skip the pairs that share no column (the host takes those exactly from
        /// the rows' one-sided sums); the accumulators then count the shared columns as well.
        shared_only: i32 = "int",
        /// Radius joins: a radius per work row, or 0 (null) for `radius`.
        row_radius: DevPtr = "const double*",
        col_mode: i32 = "int",
        ncols: i32 = "int",
        col_ids: DevPtr = "const int*",
        tile_ptr: DevPtr = "const u32*",
        /// The inverted lists' entries: (right row, value bits) as `uint2` (src/gpu/prepare.rs).
        col_entries: DevPtr = "const uint2*",
        /// A lifted metric (jensenshannon, kl_divergence, hellinger): each entry's lift, in the
        /// entries' order (`entry_lifts`); 0 (null) otherwise.
        col_lift: DevPtr = "const double*",
        /// A max (chebyshev): each right entry's rank in its row by |y| descending (255 from
        /// there on), and each right row's TOP_VALUES largest |y| (see `max_pair` in knn.cu);
        /// the same for the left chunk (ranks per entry, values per work row).
        col_ranks: DevPtr = "const unsigned char*",
        r_top: DevPtr = "const float*",
        l_rank: DevPtr = "const unsigned char*",
        l_top: DevPtr = "const float*",
        tile_rows: i32 = "int",
        ntiles: i32 = "int",
        /// The tiles cut into this many groups, a block per (work row, group) (grid.y): a launch
        /// of few left rows still fills the device. Group g's top-k of work row w is written at
        /// slot g * nwork + w; the host merges the groups (knn) or takes the pairs (radius).
        tile_groups: i32 = "int",
        p: f64 = "double",
        d: f64 = "double",
        k: i32 = "int",
        cap: i32 = "int",
        out_rows: DevPtr = "u32*",
        out_dist: DevPtr = "double*",
        out_count: DevPtr = "int*",
        radius: f64 = "double",
        r_left: DevPtr = "u32*",
        r_right: DevPtr = "u32*",
        r_dist: DevPtr = "double*",
        r_counter: DevPtr = "u64*",
        r_cap: u64 = "u64",
        /// Bilinear metrics with dense columns: the launch's tensor-core product (left rows of
        /// the chunk x `dense_stride` right rows), each pair's sum over the dense columns, or 0
        /// (null); `dense_slot` maps a column id to its dense column (-1: sparse), and those
        /// columns' inverted lists are skipped.
        dense: DevPtr = "const float*",
        dense_stride: i64 = "long long",
        dense_slot: DevPtr = "const int*",
        /// 1 when every pair whose sum is 0 has the distance `zero_dist` (dot, cosine): such
        /// rows tie in row order and the kernels finish only those that can be selected.
        zero_skip: i32 = "int",
        zero_dist: f64 = "double",
        /// Bound modes with `shared_only`: the one-sided sums of the chunk's left rows and of the
        /// part's right rows (the exact step's, `exact_one_sided`), from which the kernels take
        /// the pairs sharing no column exactly; 0 (null): such pairs are left out.
        l_one: DevPtr = "const double*",
        r_one: DevPtr = "const double*",
        /// `within=COLUMN`: the group of each left row of the chunk and of each right row of the
        /// part; a pair is offered only where the two are equal. 0 (null): no groups.
        l_group: DevPtr = "const u32*",
        r_group: DevPtr = "const u32*",
    }
}

kernel_args! {
    /// The certified metrics' exact step (`exact_pairs`, `exact_one_sided`; kernels/exact.cu).
    ExactArgs {
        /// Left rows (or, for `exact_one_sided`, the rows summed): sorted CSR, entries (column,
        /// value bits) as `uint2`.
        l_ptr: DevPtr = "const long long*",
        l_ent: DevPtr = "const uint2*",
        /// The right side's rows, the same way.
        r_ptr: DevPtr = "const long long*",
        r_ent: DevPtr = "const uint2*",
        /// The pairs (left row, right row), and how many (or the rows summed).
        pair_left: DevPtr = "const u32*",
        pair_right: DevPtr = "const u32*",
        n: i64 = "long long",
        /// `exact_one_sided`: 0 for left rows (terms against a zero on the right), 1 for right.
        side: i32 = "int",
        p: f64 = "double",
        d: f64 = "double",
        /// A reduced sum per pair (or per row).
        out: DevPtr = "double*",
    }
}

kernel_args! {
    /// The tensor-core product of the dense columns (`dense_scatter`, `dense_gemm`).
    DenseArgs {
        /// The left chunk (as in `FoldedArgs`) and its row count.
        l_off: DevPtr = "const int*",
        l_base: i64 = "long long",
        l_idx: DevPtr = "const int*",
        l_val: DevPtr = "const float*",
        rows: i32 = "int",
        col_mode: i32 = "int",
        ncols: i32 = "int",
        col_ids: DevPtr = "const int*",
        dense_slot: DevPtr = "const int*",
        /// A: the chunk's rows in the dense columns (m_pad x kp, zeroed), and its fast copy
        /// (`fast_kind`); B and its fast copy: the right part's (n_pad x kp); C = A·Bᵀ (m_pad x
        /// n_pad).
        a: DevPtr = "float*",
        a_fast: DevPtr = "void*",
        b: DevPtr = "const float*",
        b_fast: DevPtr = "const void*",
        c: DevPtr = "float*",
        kp: i32 = "int",
        n_pad: i32 = "int",
        /// Value flags (`DENSE_NOT_*` in dense.cu): A's, ORed by `dense_scatter`, and B's.
        a_flags: DevPtr = "u32*",
        b_flags: i32 = "int",
        /// The fast copies' kind (`DENSE_FAST_*`: 0 none, 1 half precision, 2 8-bit integers).
        fast_kind: i32 = "int",
    }
}

kernel_args! {
    /// A right part's dense block from its inverted lists (`dense_fill`).
    DenseFillArgs {
        tile_ptr: DevPtr = "const u32*",
        col_entries: DevPtr = "const uint2*",
        ntiles: i32 = "int",
        ncols: i32 = "int",
        dense_slot: DevPtr = "const int*",
        /// The block (n_pad x kp, zeroed) and its fast copy (`fast_kind`, as in `DenseArgs`).
        b: DevPtr = "float*",
        b_fast: DevPtr = "void*",
        kp: i32 = "int",
        fast_kind: i32 = "int",
    }
}

kernel_args! {
    /// A right part's inverted lists built on the device from its CSR (`list_count`,
    /// `list_scan_*`, `list_fill`; src/gpu/lists.rs).
    ListArgs {
        /// The part's CSR: row pointers from 0, column indices and values.
        r_off: DevPtr = "const u32*",
        r_idx: DevPtr = "const int*",
        r_val: DevPtr = "const float*",
        /// A bit per valid row, or 0 (null) when every row is valid (as in `FoldedArgs`).
        valid_bits: DevPtr = "const u32*",
        rows: i32 = "int",
        tile_rows: i32 = "int",
        ntiles: i32 = "int",
        /// The column map, as in `FoldedArgs`.
        col_mode: i32 = "int",
        ncols: i32 = "int",
        col_ids: DevPtr = "const int*",
        /// Counters, one per (column, tile) and one more per column (ncols x (ntiles + 1)):
        /// the counts, then the fill's cursors.
        cursor: DevPtr = "u32*",
        n: i64 = "long long",
        /// The scan's per-block sums, and how many blocks.
        block_sums: DevPtr = "u32*",
        nblocks: i64 = "long long",
        /// The outputs, as `FoldedArgs` reads them.
        tile_ptr: DevPtr = "u32*",
        col_entries: DevPtr = "uint2*",
        /// A max: each CSR entry's rank in its row, and the lists' ranks to fill; else 0.
        r_rank: DevPtr = "const unsigned char*",
        col_ranks: DevPtr = "unsigned char*",
    }
}

kernel_args! {
    /// The distance matrix of the folded metrics (`distance_matrix`, kernels/matrix.cu): a block
    /// per (left row of the chunk, tile of right rows).
    MatrixArgs {
        /// The chunk's left rows: row r's nonzeros (right column id, value bits), mapped on the
        /// host (columns the right side lacks and zeros left out), are
        /// `hits[hit_off[r]..hit_off[r + 1]]`.
        hit_off: DevPtr = "const long long*",
        hits: DevPtr = "const uint2*",
        /// Their totals (float64, the CPU's), and 1 for a NULL row.
        lt0: DevPtr = "const double*",
        lt1: DevPtr = "const double*",
        l_null: DevPtr = "const unsigned char*",
        n_right: i32 = "int",
        /// The right side, as `FoldedArgs` has it (valid_bits 0 when every row is valid;
        /// col_lift only for a lifted metric).
        valid_bits: DevPtr = "const u32*",
        rt0: DevPtr = "const double*",
        rt1: DevPtr = "const double*",
        tile_ptr: DevPtr = "const u32*",
        col_entries: DevPtr = "const uint2*",
        col_lift: DevPtr = "const double*",
        /// The lists' tiles (`tile_ptr` holds ntiles + 1 per column); a matrix tile is `group` of
        /// them, `mtile_rows` rows, `mtiles` in all; `span` accumulators a block.
        ntiles: i32 = "int",
        group: i32 = "int",
        mtile_rows: i32 = "int",
        mtiles: i32 = "int",
        span: i32 = "int",
        p: f64 = "double",
        d: f64 = "double",
        /// The chunk's block: left row r's distance to right row j at `out[r * out_stride + j]`.
        out: DevPtr = "double*",
        out_stride: i64 = "long long",
    }
}

kernel_args! {
    /// A filter's predicate over kept columns (`mask_program` in kernels/mask.cu).
    MaskArgs {
        /// (code, operand) pairs of `join::MaskProgram`, `n_ops` of them.
        ops: DevPtr = "const long long*",
        n_ops: i32 = "int",
        /// Each slot's column: its keys, and its validity bits (0: no NULL).
        n_columns: i32 = "int",
        values: DevPtr = "const long long* const*",
        valid: DevPtr = "const u32* const*",
        rows: i64 = "long long",
        /// A bit a row: row `32 w + b` at bit `b` of word `w`.
        words: DevPtr = "u32*",
    }
}
