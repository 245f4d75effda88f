//! The build side on the CPU: the right rows' totals plus an inverted (column → rows) index.
//!
//! Columns are stored in one of two layouts. A column held by few rows is a posting list of
//! (row, value) pairs, scattered into the accumulator. A column held by many rows (in real data:
//! stop words, the most-rated film; in Zipf-like data a handful of columns cover most nonzeros) is
//! stored dense, one value per right row with zeros, so the probe adds it to the accumulator with
//! a streaming, vectorised loop instead of a dependent scatter; that is where most of the probe's
//! work goes on such data.

use std::collections::HashMap;
use std::sync::OnceLock;

use arrow::buffer::ScalarBuffer;
use rayon::prelude::*;

use super::dense_codes::DenseCodes;
use super::int_tiles::IntTiles;
use super::minkowski::{filter_powers, minkowski_degree};
use super::union::UnionRows;
use super::vectors::Vectors;

use crate::join::{Cancel, PairList, ProbeOptions, Selection};
use crate::metric::{
    sorted_nonzeros, with_semiring, KeyForm, Metric, Reduction, RowTotals, Semiring,
};
use crate::vector::SparseBatch;

/// A column held by at least `rows / DENSE_RATIO` rows is stored dense. At that density a dense
/// column costs at most 4·8 = 32 bytes per nonzero against 8 for a posting (so the index grows at
/// most 4x), and a vectorised pass over it beats the scatter of its postings by a wide margin.
pub(crate) const DENSE_RATIO: usize = 8;

/// The dense threshold of metrics whose dense pass costs more per row: a masked pair (evaluated
/// on the zeros too, then dropped) or a lifted one (an f64 lift read beside each f32 value). On
/// the movielens shape (30K rows, 1,000 queries) 2 rather than 8 took kl_divergence from 2.0 to
/// 1.6 s, jensenshannon from 11.0 to 9.7 s and minkowski from 4.4 to 2.1 s; cosine, whose pass is
/// one multiply-add, keeps 8.
pub(crate) const COSTLY_DENSE_RATIO: usize = 2;

/// Right sides smaller than this are all postings: a dense pass buys nothing there.
const DENSE_MIN_ROWS: usize = 256;

/// `dense_slot` of a column stored as postings.
pub(crate) const SPARSE: u32 = u32::MAX;

/// A lifted metric's posting list with at most this many distinct values, and at least
/// `CODED_MIN_REUSE` postings per distinct value, is coded (see `CpuIndex::coded`): one byte per
/// posting indexes a per-probe table of the left value's pairs with each distinct value.
const CODED_MAX_DISTINCT: usize = 256;
const CODED_MIN_REUSE: usize = 8;

/// The probe of an index, compiled for the index's metric: the index keeps it behind this trait
/// so that it needs no type parameter (implemented for every metric in `probe.rs`), and the loops inside are still monomorphised per metric.
pub(crate) trait CpuKernels: std::fmt::Debug + Send + Sync {
    /// `valid`: the right rows that may be offered (the index's own flags, or those less a
    /// filter's failing rows).
    #[allow(clippy::too_many_arguments)]
    fn probe(
        &self,
        index: &CpuIndex,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
        vectors: Vectors,
        valid: &[bool],
    ) -> Vec<PairList>;

    /// `dense_block::dense_block` (its arguments checked there) of the rows `shape` says.
    fn dense_block(
        &self,
        index: &CpuIndex,
        left: &SparseBatch,
        out: &mut [f64],
        shape: super::dense_block::Shape,
        vectors: Vectors,
    );
}

/// Maps a column index to a dense column id of the build side.
#[derive(Debug)]
pub(crate) enum ColumnMap {
    /// Column ids are the indices themselves (indices below `len`).
    Direct(usize),
    /// Sparse, very wide index spaces (e.g. hashed n-grams up to 2^31).
    Hashed(HashMap<i32, u32>),
}

impl ColumnMap {
    #[inline]
    pub(crate) fn get(&self, column: i32) -> Option<u32> {
        match self {
            ColumnMap::Direct(len) => ((column as usize) < *len).then_some(column as u32),
            ColumnMap::Hashed(map) => map.get(&column).copied(),
        }
    }
}

/// The right side of a join, built once and shared by every left batch.
#[derive(Debug)]
pub struct CpuIndex {
    /// The metric's loops, compiled for its [`Semiring`] (see `probe`).
    pub(crate) kernels: Box<dyn CpuKernels>,
    /// A max over the union (chebyshev): its own strategy, not the folded one.
    pub(crate) max_reduction: bool,
    pub(crate) rows: usize,
    pub(crate) valid: Vec<bool>,
    pub(crate) totals: Vec<RowTotals>,
    pub(crate) key_form: KeyForm,
    /// Per right row, the constant of its filter value (0 where the form uses none).
    pub(crate) key_base: Vec<f64>,
    pub(crate) columns: ColumnMap,
    pub(crate) column_count: usize,
    /// Postings: column id → (row, value), rows increasing. Empty for dense columns. Buffers,
    /// not vectors: an index read from an index file uses them where the file is mapped (a
    /// fresh process's copy of 1.7 GB of postings into fresh pages was most of its time).
    pub(crate) col_ptr: Vec<usize>,
    pub(crate) col_rows: ScalarBuffer<u32>,
    pub(crate) col_vals: ScalarBuffer<f32>,
    /// Column id → its slot in `dense_vals`, or [`SPARSE`].
    pub(crate) dense_slot: Vec<u32>,
    /// Dense columns, slot-major: `dense_vals[slot * rows + row]`, zero where the row lacks it.
    pub(crate) dense_vals: Vec<f32>,
    /// A lifted metric (`Semiring::LIFTED`): the lift of every value of `col_vals` and
    /// `dense_vals`, computed once here rather than once per pair. Minkowski of a p that
    /// `math::pow` hands to libm: |v|ᵖ of each (its total term), for `minkowski.rs`. Empty
    /// otherwise.
    pub(crate) col_lifts: Vec<f64>,
    pub(crate) dense_lifts: Vec<f64>,
    /// A lifted metric's (and minkowski's of a p that takes `minkowski.rs`'s fast pow) posting
    /// lists that take few distinct values (ratings, small counts:
    /// jensenshannon's `log(x + y)` would otherwise be taken once per posting of them): column id
    /// → its range of `coded_vals`/`coded_lifts` (its distinct values and their lifts; empty for a
    /// list not coded), and per posting of a coded list its value's place in that range. The
    /// probe computes a left value's pair with each distinct value once (the same function of
    /// the same operands: the same bits) and looks it up per posting.
    pub(crate) coded: Vec<(u32, u32)>,
    pub(crate) coded_vals: Vec<f32>,
    pub(crate) coded_lifts: Vec<f64>,
    pub(crate) col_codes: Vec<u8>,
    /// Metrics with an exact union term: where each right row starts in `row_cols`/`row_vals`
    /// (a max) or in `row_entries` (a sum).
    pub(crate) row_ptr: Vec<usize>,
    /// A max (chebyshev): each right row's (column id, value) with zeros dropped, largest |value|
    /// first, so the row's largest value on a column the left row lacks is found in a few steps.
    pub(crate) row_cols: Vec<u32>,
    pub(crate) row_vals: Vec<f32>,
    /// For a sum (`union_sum`): each row's nonzeros by their own index, as
    /// `metric::sorted_nonzeros` gives them, so `metric::union_distance` computes every candidate
    /// in one order whatever the index holds (the GPU's exact step uses the same function).
    pub(crate) row_entries: Vec<(i32, f32)>,
    /// For a sum: each row's `metric::one_sided_sum` (its part of the distance to a row it
    /// shares no column with).
    pub(crate) one_sided: Vec<f64>,
    /// For a sum: what the exact step reads of `row_entries` beside it (derived from it, not
    /// stored in index files: `UnionRows::derive`).
    pub(crate) union_rows: UnionRows,
    /// A certified metric with a costly pair: its dense columns of few distinct values, coded
    /// (derived from `dense_vals`, not stored in index files: `DenseCodes::derive`).
    pub(crate) dense_codes: DenseCodes,
    /// A sum with an exact union term (minkowski): probed by `certified`.
    pub(crate) union_sum: bool,
    /// The most nonzeros of one right row (bounds the rounding error of `certified`).
    pub(crate) max_row_len: usize,
    /// The dense columns as 16-bit integers, derived on the first dense block that takes them
    /// (`int_tiles`; None where they do not fit).
    pub(crate) int_tiles: OnceLock<Option<IntTiles>>,
}

/// The arrays `build_columns`' chunks write, each chunk its own places.
struct Filled(*mut u32, *mut f32, *mut f32);
// SAFETY: the chunks write disjoint places of arrays that outlive them (see `build_columns`).
unsafe impl Send for Filled {}
unsafe impl Sync for Filled {}

impl Filled {
    /// # Safety
    /// `at` is within the postings, and no other thread writes it.
    unsafe fn posting(&self, at: usize, row: u32, value: f32) {
        unsafe {
            *self.0.add(at) = row;
            *self.1.add(at) = value;
        }
    }

    /// # Safety
    /// `at` is within the dense values, and no other thread writes it.
    unsafe fn dense(&self, at: usize, value: f32) {
        unsafe { *self.2.add(at) = value };
    }
}

impl CpuIndex {
    pub fn build(right: &SparseBatch, metric: &Metric) -> Self {
        with_semiring!(metric, s => Self::build_with(right, &s))
    }

    /// The index of `right` for any metric definition, including one defined outside the crate.
    pub fn build_with<S: Semiring>(right: &SparseBatch, s: &S) -> Self {
        let rows = right.len();
        let max_reduction = S::REDUCTION == Reduction::Max;
        let valid: Vec<bool> = (0..rows).map(|r| !right.is_null(r)).collect();
        let nnz = right.values().iter().filter(|v| **v != 0.0).count();
        let max_dim = right.max_dim();
        let columns = if max_dim <= 4 * nnz + (1 << 20) {
            ColumnMap::Direct(max_dim)
        } else {
            let mut map = HashMap::new();
            for (&c, &v) in right.indices().iter().zip(right.values()) {
                if v != 0.0 {
                    let next = map.len() as u32;
                    map.entry(c).or_insert(next);
                }
            }
            ColumnMap::Hashed(map)
        };
        let column_count = match &columns {
            ColumnMap::Direct(len) => *len,
            ColumnMap::Hashed(map) => map.len(),
        };

        let totals = if max_reduction {
            vec![RowTotals::default(); rows]
        } else {
            (0..rows)
                .map(|r| {
                    let (_, v) = right.row(r);
                    s.totals(v.iter().copied().filter(|x| *x != 0.0))
                })
                .collect()
        };

        let key_form = S::KEY;
        let key_base = totals.iter().map(|t| key_form.base(t)).collect();

        let mut index = CpuIndex {
            kernels: Box::new(*s),
            max_reduction,
            rows,
            valid,
            totals,
            key_form,
            key_base,
            columns,
            column_count,
            col_ptr: Vec::new(),
            col_rows: ScalarBuffer::from(Vec::new()),
            col_vals: ScalarBuffer::from(Vec::new()),
            dense_slot: Vec::new(),
            dense_vals: Vec::new(),
            col_lifts: Vec::new(),
            dense_lifts: Vec::new(),
            coded: Vec::new(),
            coded_vals: Vec::new(),
            coded_lifts: Vec::new(),
            col_codes: Vec::new(),
            row_ptr: Vec::new(),
            row_cols: Vec::new(),
            row_vals: Vec::new(),
            row_entries: Vec::new(),
            one_sided: Vec::new(),
            union_rows: UnionRows::default(),
            dense_codes: DenseCodes::default(),
            union_sum: !max_reduction && s.has_exact_term(),
            max_row_len: right.max_row_len(),
            int_tiles: OnceLock::new(),
        };
        // A max's dense pass is a subtraction and a max per row, as cheap as cosine's.
        let dense_ratio = if max_reduction || (S::PAIR_VANISHES && !S::LIFTED) {
            DENSE_RATIO
        } else {
            COSTLY_DENSE_RATIO
        };
        index.build_columns(right, dense_ratio);
        if S::LIFTED {
            index.col_lifts = index.col_vals.iter().map(|&v| s.lift(v)).collect();
            index.dense_lifts = index.dense_vals.iter().map(|&v| s.lift(v)).collect();
            index.code_columns();
            index.coded_lifts = index.coded_vals.iter().map(|&v| s.lift(v)).collect();
        } else if let Some((p, true)) = minkowski_degree(s) {
            // |v|ᵖ by the folded pass's own power, not libm's pow (which was a quarter of
            // minkowski p = 2.5's build on anchors.py's shapes): the lifts only feed the bounds.
            index.col_lifts = filter_powers(p, &index.col_vals);
            index.dense_lifts = filter_powers(p, &index.dense_vals);
            let prm = s.params();
            let power = |&v: &f32| S::total0(v as f64, &prm);
            // Lists of few distinct values take one pair per distinct value, as a lifted
            // metric's do (`minkowski.rs`).
            index.code_columns();
            index.coded_lifts = index.coded_vals.iter().map(power).collect();
        }
        index.dense_codes = DenseCodes::derive(s, &index);
        if max_reduction {
            index.build_rows_by_magnitude(right, nnz);
        } else if index.union_sum {
            index.build_row_entries(right, nnz);
            index.union_rows = UnionRows::derive(s, &index.columns, &index.row_entries)
                .expect("every column of the build side is in its column map");
            // Each row's `one_sided_sum` from the right-only terms just computed: the terms it
            // takes, added in its order (the same bits), without a second libm pow or log per
            // stored value (minkowski p = 2.5's build on news20 was 0.26 s to cosine's 0.06).
            let (ptr, terms) = (&index.row_ptr, &index.union_rows.terms);
            index.one_sided = (0..rows)
                .into_par_iter()
                .map(|r| terms[ptr[r]..ptr[r + 1]].iter().fold(0.0, |sum, t| sum + t))
                .collect();
        }
        index
    }

    /// The posting lists and dense columns, from chunks of rows on all cores: each chunk counts
    /// its nonzeros per column, then writes them where the earlier chunks' end (a list's rows
    /// still increase). On one core the PBMC cells' build was most of `fit`.
    fn build_columns(&mut self, right: &SparseBatch, dense_ratio: usize) {
        let (rows, columns) = (self.rows, self.column_count);
        // (a count per column per chunk: few chunks where the columns outnumber the nonzeros)
        let chunks = rayon::current_num_threads()
            .min(rows / 512 + 1)
            .min(right.values().len() / columns.max(1) + 1)
            .max(1);
        let bounds: Vec<_> = (0..chunks)
            .map(|k| k * rows / chunks..(k + 1) * rows / chunks)
            .collect();
        let map = &self.columns;
        let column_of = |c: i32| map.get(c).expect("column of the build side") as usize;
        let nonzeros = |r: usize| {
            let (idx, val) = right.row(r);
            idx.iter().zip(val).filter(|(_, &v)| v != 0.0)
        };
        let mut fill: Vec<Vec<usize>> = bounds
            .par_iter()
            .map(|range| {
                let mut counts = vec![0usize; columns];
                for (&c, _) in range.clone().flat_map(nonzeros) {
                    counts[column_of(c)] += 1;
                }
                counts
            })
            .collect();
        let dense_from = if rows >= DENSE_MIN_ROWS {
            rows.div_ceil(dense_ratio)
        } else {
            usize::MAX
        };
        let mut col_ptr = vec![0usize; columns + 1];
        let mut dense = 0u32;
        self.dense_slot = (0..columns)
            .map(|col| {
                let count = fill.iter().map(|counts| counts[col]).sum::<usize>();
                if count >= dense_from {
                    dense += 1;
                    dense - 1
                } else {
                    col_ptr[col + 1] = count;
                    SPARSE
                }
            })
            .collect();
        for col in 0..columns {
            col_ptr[col + 1] += col_ptr[col];
            // Each chunk's first posting of the list: after the earlier chunks' ones.
            let mut at = col_ptr[col];
            for counts in fill.iter_mut() {
                at += std::mem::replace(&mut counts[col], at);
            }
        }
        let postings = col_ptr[columns];
        let mut col_rows = vec![0u32; postings];
        let mut col_vals = vec![0f32; postings];
        let mut dense_vals = vec![0f32; dense as usize * rows];
        let out = Filled(
            col_rows.as_mut_ptr(),
            col_vals.as_mut_ptr(),
            dense_vals.as_mut_ptr(),
        );
        let dense_slot = &self.dense_slot;
        bounds
            .into_par_iter()
            .zip(&mut fill)
            .for_each(|(range, fill)| {
                for r in range {
                    for (&c, &v) in nonzeros(r) {
                        let col = column_of(c);
                        match dense_slot[col] {
                            SPARSE => {
                                let at = fill[col];
                                fill[col] += 1;
                                assert!(at < col_ptr[col + 1]);
                                // SAFETY: `at` is in this chunk's part of the list (its count,
                                // above), which no other chunk writes.
                                unsafe { out.posting(at, r as u32, v) };
                            }
                            slot => {
                                let at = slot as usize * rows + r;
                                assert!(at < dense as usize * rows);
                                // SAFETY: row r is this chunk's alone.
                                unsafe { out.dense(at, v) };
                            }
                        }
                    }
                }
            });
        self.col_ptr = col_ptr;
        self.col_rows = col_rows.into();
        self.col_vals = col_vals.into();
        self.dense_vals = dense_vals;
    }

    /// `coded`, `coded_vals`, `col_codes`: the posting lists of few distinct values. Each list's
    /// distinct values are found through a small open-addressing table of value bits (a
    /// `HashMap` per posting made the build of kl_divergence a tenth slower).
    fn code_columns(&mut self) {
        const SLOTS: usize = 4 * CODED_MAX_DISTINCT;
        self.coded = vec![(0, 0); self.column_count];
        self.col_codes = vec![0; self.col_vals.len()];
        // (value bits, place, the column that wrote it): a slot of another column is empty.
        let mut table = vec![(0u32, 0u8, u32::MAX); SLOTS];
        for col in 0..self.column_count {
            let (start, end) = (self.col_ptr[col], self.col_ptr[col + 1]);
            let most = CODED_MAX_DISTINCT.min((end - start) / CODED_MIN_REUSE);
            if most == 0 {
                continue;
            }
            let first = self.coded_vals.len();
            let mut coded = true;
            for p in start..end {
                let bits = self.col_vals[p].to_bits();
                let mut slot = (bits.wrapping_mul(0x9e37_79b1) >> 22) as usize % SLOTS;
                loop {
                    let (b, place, owner) = table[slot];
                    if owner != col as u32 {
                        let place = self.coded_vals.len() - first;
                        if place == most {
                            coded = false;
                            break;
                        }
                        self.coded_vals.push(self.col_vals[p]);
                        table[slot] = (bits, place as u8, col as u32);
                        self.col_codes[p] = place as u8;
                        break;
                    }
                    if b == bits {
                        self.col_codes[p] = place;
                        break;
                    }
                    slot = (slot + 1) % SLOTS;
                }
                if !coded {
                    break;
                }
            }
            if coded {
                self.coded[col] = (first as u32, self.coded_vals.len() as u32);
            } else {
                self.coded_vals.truncate(first);
            }
        }
        if self.coded_vals.is_empty() {
            self.coded = Vec::new();
            self.col_codes = Vec::new();
        }
    }

    /// The distinct values of column `col`'s postings and their lifts, if the list is coded.
    #[inline(always)]
    pub(crate) fn coded_column(&self, col: usize) -> Option<(&[f32], &[f64])> {
        let &(start, end) = self.coded.get(col)?;
        let range = start as usize..end as usize;
        (end > start).then(|| (&self.coded_vals[range.clone()], &self.coded_lifts[range]))
    }

    /// `row_entries`: each right row as `metric::sorted_nonzeros` gives it.
    fn build_row_entries(&mut self, right: &SparseBatch, nnz: usize) {
        self.row_ptr = Vec::with_capacity(self.rows + 1);
        self.row_ptr.push(0);
        self.row_entries = Vec::with_capacity(nnz);
        for r in 0..self.rows {
            self.row_entries.extend(sorted_nonzeros(right.row(r)));
            self.row_ptr.push(self.row_entries.len());
        }
    }

    /// `row_cols`/`row_vals`: each right row by column id, zeros dropped, largest |value| first.
    fn build_rows_by_magnitude(&mut self, right: &SparseBatch, nnz: usize) {
        self.row_ptr = Vec::with_capacity(self.rows + 1);
        self.row_ptr.push(0);
        self.row_cols = Vec::with_capacity(nnz);
        self.row_vals = Vec::with_capacity(nnz);
        let mut entries: Vec<(u32, f32)> = Vec::new();
        for r in 0..self.rows {
            let (idx, val) = right.row(r);
            entries.clear();
            entries.extend(
                idx.iter()
                    .zip(val)
                    .filter(|(_, &v)| v != 0.0)
                    .map(|(&c, &v)| (self.columns.get(c).unwrap(), v)),
            );
            entries.sort_unstable_by(|a, b| b.1.abs().total_cmp(&a.1.abs()));
            self.row_cols.extend(entries.iter().map(|e| e.0));
            self.row_vals.extend(entries.iter().map(|e| e.1));
            self.row_ptr.push(self.row_cols.len());
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The dense columns as 16-bit integers ([`IntTiles`]), derived once; None where they are
    /// not all such integers.
    pub(crate) fn int_tiles(&self) -> Option<&IntTiles> {
        self.int_tiles
            .get_or_init(|| IntTiles::derive(self))
            .as_ref()
    }

    /// Columns stored dense (for diagnostics and benchmarks).
    pub fn dense_columns(&self) -> usize {
        self.dense_vals.len().checked_div(self.rows).unwrap_or(0)
    }

    /// Bytes held by the index (for memory reservations).
    pub fn memory_size(&self) -> usize {
        self.valid.len()
            + self.totals.len() * std::mem::size_of::<RowTotals>()
            + (self.key_base.len()
                + self.col_lifts.len()
                + self.dense_lifts.len()
                + self.coded_lifts.len()
                + self.coded.len())
                * 8
            + self.col_codes.len()
            + self.coded_vals.len() * 4
            + (self.col_ptr.len() + self.row_ptr.len()) * 8
            + (self.col_rows.len()
                + self.col_vals.len()
                + self.dense_slot.len()
                + self.dense_vals.len()
                + self.row_cols.len()
                + self.row_vals.len()
                + self.row_entries.len() * 2
                + self.one_sided.len() * 2
                + self.union_rows.len() * 3)
                * 4
            + self.dense_codes.memory_size()
            + self
                .int_tiles
                .get()
                .and_then(Option::as_ref)
                .map_or(0, IntTiles::memory_size)
            + match &self.columns {
                ColumnMap::Direct(_) => 0,
                ColumnMap::Hashed(m) => m.len() * 16,
            }
    }

    /// Working memory per CPU thread while probing.
    pub fn workspace_size(&self) -> usize {
        if self.max_reduction {
            self.rows * 12 + self.column_count * 4
        } else if self.union_sum {
            self.rows * 16 + self.column_count * 8
        } else {
            self.rows * 16
        }
    }
}
