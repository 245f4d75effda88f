//! The build side on the CPU: the right rows as CSR plus an inverted (column → rows) index.

use std::collections::HashMap;

use crate::metric::{with_semiring, Metric, MetricKind, RowTotals, Semiring};
use crate::vector::SparseBatch;

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
    pub(crate) metric: Metric,
    pub(crate) rows: usize,
    pub(crate) valid: Vec<bool>,
    pub(crate) totals: Vec<RowTotals>,
    pub(crate) columns: ColumnMap,
    pub(crate) column_count: usize,
    /// Inverted index over nonzeros: column id → (row, value).
    pub(crate) col_ptr: Vec<usize>,
    pub(crate) col_rows: Vec<u32>,
    pub(crate) col_vals: Vec<f32>,
    /// Chebyshev walks right rows directly: CSR with column ids, zeros dropped.
    pub(crate) row_ptr: Vec<usize>,
    pub(crate) row_cols: Vec<u32>,
    pub(crate) row_vals: Vec<f32>,
}

impl CpuIndex {
    pub fn build(right: &SparseBatch, metric: &Metric) -> Self {
        let rows = right.len();
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

        let totals = if metric.kind == MetricKind::Chebyshev {
            vec![RowTotals::default(); rows]
        } else {
            with_semiring!(metric, s => (0..rows)
                .map(|r| {
                    let (_, v) = right.row(r);
                    s.totals(v.iter().copied().filter(|x| *x != 0.0))
                })
                .collect())
        };

        let mut index = CpuIndex {
            metric: *metric,
            rows,
            valid,
            totals,
            columns,
            column_count,
            col_ptr: Vec::new(),
            col_rows: Vec::new(),
            col_vals: Vec::new(),
            row_ptr: Vec::new(),
            row_cols: Vec::new(),
            row_vals: Vec::new(),
        };
        if metric.kind == MetricKind::Chebyshev {
            index.build_rows(right, nnz);
        } else {
            index.build_columns(right, nnz);
        }
        index
    }

    fn build_columns(&mut self, right: &SparseBatch, nnz: usize) {
        let mut counts = vec![0usize; self.column_count + 1];
        for r in 0..self.rows {
            let (idx, val) = right.row(r);
            for (&c, &v) in idx.iter().zip(val) {
                if v != 0.0 {
                    counts[self.columns.get(c).expect("column of the build side") as usize + 1] += 1;
                }
            }
        }
        for c in 0..self.column_count {
            counts[c + 1] += counts[c];
        }
        let mut fill = counts.clone();
        self.col_rows = vec![0; nnz];
        self.col_vals = vec![0.0; nnz];
        for r in 0..self.rows {
            let (idx, val) = right.row(r);
            for (&c, &v) in idx.iter().zip(val) {
                if v != 0.0 {
                    let slot = &mut fill[self.columns.get(c).unwrap() as usize];
                    self.col_rows[*slot] = r as u32;
                    self.col_vals[*slot] = v;
                    *slot += 1;
                }
            }
        }
        self.col_ptr = counts;
    }

    fn build_rows(&mut self, right: &SparseBatch, nnz: usize) {
        self.row_ptr = Vec::with_capacity(self.rows + 1);
        self.row_ptr.push(0);
        self.row_cols = Vec::with_capacity(nnz);
        self.row_vals = Vec::with_capacity(nnz);
        for r in 0..self.rows {
            let (idx, val) = right.row(r);
            for (&c, &v) in idx.iter().zip(val) {
                if v != 0.0 {
                    self.row_cols.push(self.columns.get(c).unwrap());
                    self.row_vals.push(v);
                }
            }
            self.row_ptr.push(self.row_cols.len());
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn metric(&self) -> &Metric {
        &self.metric
    }

    /// Bytes held by the index (for memory reservations).
    pub fn memory_size(&self) -> usize {
        self.valid.len()
            + self.totals.len() * std::mem::size_of::<RowTotals>()
            + (self.col_ptr.len() + self.row_ptr.len()) * 8
            + (self.col_rows.len() + self.col_vals.len() + self.row_cols.len() + self.row_vals.len()) * 4
            + match &self.columns {
                ColumnMap::Direct(_) => 0,
                ColumnMap::Hashed(m) => m.len() * 16,
            }
    }

    /// Working memory per CPU thread while probing.
    pub fn workspace_size(&self) -> usize {
        if self.metric.kind == MetricKind::Chebyshev {
            self.column_count * 20
        } else {
            self.rows * 16
        }
    }
}
