//! The distance matrix (`pairwise_distances`, the paper's second call after kNN) as an operation
//! of every index: each left row against every right row, written row-major into the caller's
//! array. A backend that computes the block directly (the CPU's dense blocks, the GPU's matrix
//! kernel) overrides [`JoinIndex::distance_matrix`]; any other index answers it from a probe
//! within an infinite radius, its pairs placed in the array ([`matrix_by_probe`]).

use datafusion::common::{exec_err, Result};

use super::backend::JoinIndex;
use super::selection::{ProbeOptions, Selection};
use crate::metric::Metric;
use crate::vector::SparseBatch;

/// Pairs per probe of [`matrix_by_probe`] (16 bytes each while they live): every pair of a
/// block of left rows is kept, so the block is cut by rows × right rows. 256K pairs (4 MB)
/// stay in the caches and the allocator reuses their memory.
const PROBE_BLOCK_PAIRS: usize = 1 << 18;

/// The left rows of a distance matrix.
#[derive(Debug, Clone, Copy)]
pub enum MatrixRows<'a> {
    /// Rows the caller gives.
    Given(&'a SparseBatch),
    /// The rows the index was built from (the caller vouches; lengths are checked): a backend
    /// may compute each pair once where the metric is symmetric, and mirror the rest.
    Own(&'a SparseBatch),
}

impl<'a> MatrixRows<'a> {
    pub fn rows(&self) -> &'a SparseBatch {
        match self {
            MatrixRows::Given(rows) | MatrixRows::Own(rows) => rows,
        }
    }

    pub fn is_own(&self) -> bool {
        matches!(self, MatrixRows::Own(_))
    }
}

/// Where a matrix is written: left row r's distance to right row j (`j < columns`) at
/// `values[r * stride + j]`. A shard of the right side writes its columns of the same rows.
#[derive(Debug)]
pub struct MatrixOut<'a> {
    pub values: &'a mut [f64],
    pub stride: usize,
    pub columns: usize,
}

impl<'a> MatrixOut<'a> {
    /// The whole of `values` as `rows` × `columns`, row-major; an error where it is too short.
    pub fn new(values: &'a mut [f64], rows: usize, columns: usize) -> Result<Self> {
        let out = MatrixOut {
            values,
            stride: columns,
            columns,
        };
        out.check(rows)?;
        Ok(out)
    }

    /// Columns `first..first + columns` of the same rows.
    pub fn columns(&mut self, first: usize, columns: usize) -> MatrixOut<'_> {
        let first = first.min(self.values.len());
        MatrixOut {
            values: &mut self.values[first..],
            stride: self.stride,
            columns,
        }
    }

    /// Rows `first..` of the same columns.
    pub fn rows_from(&mut self, first: usize) -> MatrixOut<'_> {
        let at = (first * self.stride).min(self.values.len());
        MatrixOut {
            values: &mut self.values[at..],
            stride: self.stride,
            columns: self.columns,
        }
    }

    /// An error unless `rows` rows of `columns` values fit.
    pub fn check(&self, rows: usize) -> Result<()> {
        let needed = match rows {
            0 => Some(0),
            rows => (rows - 1)
                .checked_mul(self.stride)
                .and_then(|v| v.checked_add(self.columns)),
        };
        match needed {
            Some(needed) if self.stride >= self.columns && self.values.len() >= needed => Ok(()),
            _ => exec_err!(
                "a matrix of {rows} x {} distances does not fit {} values with a stride of {}",
                self.columns,
                self.values.len(),
                self.stride
            ),
        }
    }

    /// Row `r`'s `columns` values.
    pub fn row(&mut self, r: usize) -> &mut [f64] {
        let at = r * self.stride;
        &mut self.values[at..at + self.columns]
    }
}

/// The matrix of `left` against `index` from probes within an infinite radius (for a
/// similarity, at least −∞), a block of left rows at a time, each pair placed where it goes; a
/// pair no probe returns (a NULL row on either side) reads NaN.
pub fn matrix_by_probe<I: JoinIndex + ?Sized>(
    index: &I,
    metric: &Metric,
    left: &SparseBatch,
    mut out: MatrixOut<'_>,
) -> Result<()> {
    out.check(left.len())?;
    let everything = if metric.kind.is_similarity() {
        f64::NEG_INFINITY
    } else {
        f64::INFINITY
    };
    let block = (PROBE_BLOCK_PAIRS / out.columns.max(1)).max(1);
    let mut first = 0;
    while first < left.len() {
        let rows = block.min(left.len() - first);
        let pairs = index
            .probe(
                &left.slice(first, rows),
                Selection::Within(everything),
                ProbeOptions::default(),
            )?
            .into_pairs();
        let mut block_out = out.rows_from(first);
        place_pairs(&mut block_out, rows, &pairs);
        first += rows;
    }
    Ok(())
}

/// `pairs` (left rows of the block, right rows) into `out`'s first `rows` rows: in one pass
/// where they are every pair in row-major order (what a CPU probe within an infinite radius
/// gives), else one by one over rows first set to NaN.
fn place_pairs(out: &mut MatrixOut<'_>, rows: usize, pairs: &super::PairList) {
    let m = out.columns;
    let complete = pairs.len() == rows * m
        && (0..rows).all(|row| {
            let at = row * m;
            pairs.left[at..at + m].iter().all(|&l| l as usize == row)
                && pairs.right[at..at + m]
                    .iter()
                    .enumerate()
                    .all(|(c, &r)| r as usize == c)
        });
    if complete {
        for row in 0..rows {
            out.row(row)
                .copy_from_slice(&pairs.distance[row * m..(row + 1) * m]);
        }
        return;
    }
    for row in 0..rows {
        out.row(row).fill(f64::NAN);
    }
    for i in 0..pairs.len() {
        let (l, r) = (pairs.left[i] as usize, pairs.right[i] as usize);
        if l < rows && r < m {
            out.values[l * out.stride + r] = pairs.distance[i];
        }
    }
}
