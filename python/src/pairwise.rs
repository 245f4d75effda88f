//! `pairwise_distances` on the CPU: the right side's CPU index built directly, and each piece
//! of left rows written straight into the output by the crate's dense block
//! (`cpu::dense_block`): no pairs (16 bytes each, then copied into the output), which were two
//! thirds of the time through `FittedIndex.pairwise`.
//!
//! Where the dense block does not apply (a GPU, chebyshev and the metrics with union terms, an
//! option a fitted index refuses) `fit` answers None and the package takes `FittedIndex`.

use datafusion::common::Result;
use datafusion_sparse_knn::cpu::{dense_block, dense_block_symmetric, fills_dense_block, CpuIndex};
use datafusion_sparse_knn::join::{max_chunk_nnz, split_rows};
use datafusion_sparse_knn::metric::MetricKind;
use datafusion_sparse_knn::options::{ExcludeSelf, JoinOptions};
use datafusion_sparse_knn::planner::{resolve_device, Device, Side};
use datafusion_sparse_knn::{Metric, SparseBatch};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::fitted::{pieces, rows_of};
use crate::value_error;

/// The right side of one `pairwise_distances` call, indexed on the CPU.
#[pyclass(frozen, module = "datafusion_sparse_knn._internal")]
pub(crate) struct DenseBlockIndex {
    /// Each shard's first right row (its first column of the output) and its index: pieces of
    /// at most `max_chunk_nnz()` entries, as a join cuts its right side.
    shards: Vec<(usize, CpuIndex)>,
    /// The fitted rows: `pairwise(None)` computes them against themselves.
    rows: Vec<SparseBatch>,
    metric: Metric,
    n_rows: usize,
    query_column: Option<String>,
}

#[pymethods]
impl DenseBlockIndex {
    /// The CPU index of `rows` (a `Csr` or a `Source`) for `metric` with the SQL options, or
    /// None where the dense block does not compute the call.
    #[staticmethod]
    #[pyo3(signature = (rows, metric, options))]
    fn fit(
        py: Python<'_>,
        rows: &Bound<'_, PyAny>,
        metric: &str,
        options: &str,
    ) -> PyResult<Option<Self>> {
        let opts = JoinOptions::default().apply(options).map_err(value_error)?;
        let metric = opts.metric(metric).map_err(value_error)?;
        let device = resolve_device("pairwise_distances", opts.device).map_err(value_error)?;
        if device != Device::Cpu
            || !fills_dense_block(&metric)
            || !matches!(opts.exclude_self, ExcludeSelf::Off)
        {
            return Ok(None);
        }
        let column = opts.right_column.as_deref();
        let rows = pieces(py, rows, &metric, "Y", Side::Right, column)?;
        let n_rows = rows_of(&rows);
        if n_rows == 0 || n_rows > u32::MAX as usize {
            // FittedIndex says what is wrong with it.
            return Ok(None);
        }
        let shards = py.detach(|| build(&rows, &metric)).map_err(value_error)?;
        Ok(Some(DenseBlockIndex {
            shards,
            rows,
            metric,
            n_rows,
            query_column: opts.left_column.clone(),
        }))
    }

    /// Rows fitted.
    #[getter]
    fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Every distance between the query rows (`rows=None`: the fitted rows, own pairs
    /// included, each pair computed once where the metric is symmetric) and the fitted rows:
    /// a float64 numpy array of shape (n, fitted rows), NaN
    /// where either row is NULL.
    #[pyo3(signature = (rows))]
    fn pairwise<'py>(
        &self,
        py: Python<'py>,
        rows: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let given;
        let left: &[SparseBatch] = match rows {
            None => &self.rows,
            Some(rows) => {
                let column = self.query_column.as_deref();
                given = pieces(py, rows, &self.metric, "X", Side::Left, column)?;
                &given
            }
        };
        let (n, m) = (rows_of(left), self.n_rows);
        if n.checked_mul(m).and_then(|c| c.checked_mul(8)).is_none() {
            return Err(PyValueError::new_err(format!(
                "pairwise_distances: {n} x {m} does not fit an array"
            )));
        }
        // numpy.empty, not a bytearray: a bytearray is zeroed first, which for 10,000 x 10,000
        // rows (800 MB) took as long as computing the distances, on one core.
        let array = py.import("numpy")?.call_method1("empty", ((n, m),))?;
        let interface = array.getattr("__array_interface__")?;
        let address: usize = interface.get_item("data")?.get_item(0)?.extract()?;
        if n * m > 0 {
            let out = address as *mut f64;
            // SAFETY: `array` is the C-contiguous float64 array of n × m values just made, held
            // here and by no one else while it is written (numpy aligns its data to 16 bytes).
            let out = unsafe { std::slice::from_raw_parts_mut(out, n * m) };
            py.detach(|| self.fill(left, out)).map_err(value_error)?;
        }
        Ok(array)
    }
}

/// One CPU index per piece of at most `max_chunk_nnz()` entries, with its first row.
fn build(rows: &[SparseBatch], metric: &Metric) -> Result<Vec<(usize, CpuIndex)>> {
    let mut first = 0;
    let mut shards = Vec::new();
    for chunk in split_rows(rows.to_vec(), max_chunk_nnz())? {
        let rows = chunk.len();
        shards.push((first, CpuIndex::build(&chunk, metric)));
        first += rows;
    }
    Ok(shards)
}

impl DenseBlockIndex {
    /// The rows of `left` against every shard, into `out` (row-major).
    fn fill(&self, left: &[SparseBatch], out: &mut [f64]) -> Result<()> {
        let m = self.n_rows;
        if let ([rows], [(_, index)]) = (left, &self.shards[..]) {
            // The fitted rows against themselves (a single piece and index, as all but the
            // largest are), by a symmetric metric: each pair once.
            let own = std::ptr::eq(left, &self.rows[..]);
            if own && self.metric.kind != MetricKind::KlDivergence {
                return dense_block_symmetric(index, rows, out, m);
            }
        }
        let mut first = 0;
        for piece in left.iter().filter(|p| !p.is_empty()) {
            self.fill_piece(piece, &mut out[first * m..(first + piece.len()) * m])?;
            first += piece.len();
        }
        Ok(())
    }

    fn fill_piece(&self, piece: &SparseBatch, out: &mut [f64]) -> Result<()> {
        for (first, index) in &self.shards {
            dense_block(index, piece, &mut out[*first..], self.n_rows)?;
        }
        Ok(())
    }
}
