//! `FittedIndex`: the right side built once and probed directly by query rows, without a
//! DataFusion plan, for the estimator `NearestNeighbors`, `KNeighborsTransformer`, the graphs and
//! `pairwise_distances`.
//!
//! The built side is a [`Built`]: the backend's [`JoinIndex`] over the fitted rows, the value
//! `knn_join` builds for its right side. Probes are cut into the planner's probe size; results
//! are written straight into `bytearray`s that the package wraps as numpy arrays (no copy).

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::ArrowNativeType;
use datafusion::common::{exec_err, Result};
use datafusion_sparse_knn::cpu::CpuBackend;
use datafusion_sparse_knn::gpu::{GpuBackend, GpuOptions};
use datafusion_sparse_knn::join::{
    max_chunk_nnz, Backend, JoinIndex, PairList, ProbeOptions, Selection,
};
use datafusion_sparse_knn::options::{ExcludeSelf, JoinOptions};
use datafusion_sparse_knn::planner::{find_vector_column, resolve_device, Device, Side};
use datafusion_sparse_knn::vector::VectorCheck;
use datafusion_sparse_knn::{Metric, SparseBatch};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyByteArray;

use crate::csr::Csr;
use crate::source::{read_all, Source};
use crate::{runtime, value_error};

/// Left rows per probe: the planner's probe size (`planner/exec`), so that a call here asks a
/// backend for nothing a join does not.
const PROBE_ROWS: usize = 64 * 1024;

/// Pairs per probe of `pairwise_distances` (16 bytes each while they live): every pair of a
/// block of left rows is kept, so the block is cut by rows × right rows.
const PAIRWISE_BLOCK_PAIRS: usize = 1 << 22;

/// The right side as built for probing.
struct Built {
    index: Box<dyn JoinIndex>,
}

impl Built {
    fn build(
        pieces: Vec<SparseBatch>,
        metric: &Metric,
        device: Device,
        options: &JoinOptions,
    ) -> Result<Self> {
        let backend: Box<dyn Backend> = match device {
            Device::Cpu => Box::new(CpuBackend),
            Device::Gpu => Box::new(GpuBackend {
                options: GpuOptions {
                    memory_limit: options.gpu_memory_limit,
                    gpus: options.gpus.clone(),
                    dense_columns: options.dense_columns,
                },
            }),
        };
        Ok(Self {
            index: backend.build_pieces(pieces, metric)?,
        })
    }

    fn probe(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
    ) -> Result<PairList> {
        Ok(self.index.probe(left, selection, options)?.into_pairs())
    }
}

/// What a fit made: the built side, the metric and the fitted rows (to query them again).
struct Fitted {
    built: Built,
    metric: Metric,
    device: Device,
    /// The fitted rows, in pieces: `kneighbors(None)` probes them against themselves.
    rows: Vec<SparseBatch>,
    n_rows: usize,
    /// `left_column`: the query rows' vector column in Arrow or Parquet input.
    query_column: Option<String>,
}

/// Which rows a call asks about: given ones, or the fitted rows themselves (each row's own pair
/// left out, as scikit-learn does for `X=None`).
enum Query {
    Given(Vec<SparseBatch>),
    Fitted,
}

fn check(metric: &Metric, column: &str) -> VectorCheck {
    VectorCheck::new(column)
        .with_dim(metric.dim)
        .with_nonnegative_for(metric.kind.needs_nonnegative().then(|| metric.name()))
}

/// The vectors of `rows` (a [`Csr`] or a [`Source`]) converted and checked for `metric`.
fn pieces(
    py: Python<'_>,
    rows: &Bound<'_, PyAny>,
    metric: &Metric,
    what: &str,
    side: Side,
    column: Option<&str>,
) -> PyResult<Vec<SparseBatch>> {
    let check = check(metric, what);
    if let Ok(csr) = rows.cast::<Csr>() {
        let csr = csr.get();
        return py.detach(|| csr.pieces(&check)).map_err(value_error);
    }
    let Ok(source) = rows.cast::<Source>() else {
        return Err(PyValueError::new_err(format!(
            "{what}: expected rows as a Csr or a Source, got {}",
            rows.get_type().name()?
        )));
    };
    let input = source.get().input.clone();
    py.detach(|| {
        runtime().block_on(async {
            let (schema, batches) = read_all(&input).await?;
            let vector = find_vector_column(what, side, &schema, column)?;
            let name = schema.field(vector).name().clone();
            let mut out = Vec::new();
            let mut row = 0u64;
            for batch in &batches {
                let check = check.clone().with_first_row(row);
                let check = VectorCheck {
                    column: name.clone(),
                    ..check
                };
                out.extend(SparseBatch::try_from_array_chunked(
                    batch.column(vector).as_ref(),
                    &check,
                    max_chunk_nnz(),
                )?);
                row += RecordBatch::num_rows(batch) as u64;
            }
            Ok(out)
        })
    })
    .map_err(value_error)
}

/// Runs of at most `most` rows over `pieces`: (the run's first row overall, the run).
fn runs(pieces: &[SparseBatch], most: usize) -> Vec<(usize, SparseBatch)> {
    let mut out = Vec::new();
    let mut first = 0;
    for piece in pieces {
        let mut start = 0;
        while start < piece.len() {
            let len = most.min(piece.len() - start);
            out.push((first + start, piece.slice(start, len)));
            start += len;
        }
        first += piece.len();
    }
    out
}

impl Fitted {
    fn query_rows<'a>(&'a self, query: &'a Query) -> &'a [SparseBatch] {
        match query {
            Query::Given(pieces) => pieces,
            Query::Fitted => &self.rows,
        }
    }

    /// Every probe of `query` with `selection`, `visit(first row of the run, its pairs)` in row
    /// order; runs of at most `most` rows.
    fn probe_runs(
        &self,
        query: &Query,
        selection: Selection,
        most: usize,
        mut visit: impl FnMut(usize, PairList) -> Result<()>,
    ) -> Result<()> {
        for (first, run) in runs(self.query_rows(query), most) {
            let options = ProbeOptions {
                exclude_self_from: matches!(query, Query::Fitted).then_some(first as i64),
            };
            visit(first, self.built.probe(&run, selection, options)?)?;
        }
        Ok(())
    }

    fn similarity(&self) -> bool {
        self.metric.kind.is_similarity()
    }
}

fn rows_of(pieces: &[SparseBatch]) -> usize {
    pieces.iter().map(SparseBatch::len).sum()
}

/// Writes `value` into slot `slot` of `out`, in native byte order (what numpy reads back).
fn put_f64(out: &mut [u8], slot: usize, value: f64) {
    out[slot * 8..slot * 8 + 8].copy_from_slice(&value.to_ne_bytes());
}

/// `values` as a bytearray (native byte order), which the package wraps as a writable numpy
/// array without a copy.
fn bytes<T: ArrowNativeType>(py: Python<'_>, values: Vec<T>) -> Bound<'_, PyByteArray> {
    PyByteArray::new(py, Buffer::from_vec(values).as_slice())
}

fn fill_f64(out: &mut [u8], value: f64) {
    for chunk in out.chunks_exact_mut(8) {
        chunk.copy_from_slice(&value.to_ne_bytes());
    }
}

/// The right side of `NearestNeighbors`, built once by `fit` and probed by every call.
#[pyclass(frozen, module = "datafusion_sparse_knn._internal")]
pub(crate) struct FittedIndex {
    inner: Arc<Fitted>,
}

#[pymethods]
impl FittedIndex {
    /// Builds the index of `rows` (a `Csr` or a `Source`) for `metric` with the SQL options.
    #[staticmethod]
    #[pyo3(signature = (rows, metric, options))]
    fn fit(py: Python<'_>, rows: &Bound<'_, PyAny>, metric: &str, options: &str) -> PyResult<Self> {
        let opts = JoinOptions::default().apply(options).map_err(value_error)?;
        if !matches!(opts.exclude_self, ExcludeSelf::Off) {
            return Err(PyValueError::new_err(
                "NearestNeighbors: option exclude_self does not apply; kneighbors(X=None) leaves \
                 each fitted row's own pair out, as scikit-learn does",
            ));
        }
        let metric = opts.metric(metric).map_err(value_error)?;
        let device = resolve_device("NearestNeighbors.fit", opts.device).map_err(value_error)?;
        let pieces = pieces(
            py,
            rows,
            &metric,
            "Y",
            Side::Right,
            opts.right_column.as_deref(),
        )?;
        let n_rows = rows_of(&pieces);
        if n_rows == 0 {
            return Err(PyValueError::new_err(
                "NearestNeighbors.fit: found array with 0 sample(s); at least 1 is required",
            ));
        }
        if n_rows > u32::MAX as usize {
            return Err(PyValueError::new_err(format!(
                "NearestNeighbors.fit: {n_rows} rows; at most {} are supported",
                u32::MAX
            )));
        }
        let built = py
            .detach(|| Built::build(pieces.clone(), &metric, device, &opts))
            .map_err(value_error)?;
        Ok(Self {
            inner: Arc::new(Fitted {
                built,
                metric,
                device,
                rows: pieces,
                n_rows,
                query_column: opts.left_column.clone(),
            }),
        })
    }

    /// Rows fitted.
    #[getter]
    fn n_rows(&self) -> usize {
        self.inner.n_rows
    }

    /// The metric's canonical name.
    #[getter]
    fn metric(&self) -> &'static str {
        self.inner.metric.name()
    }

    /// True for `dot`, a similarity: nearest is largest.
    #[getter]
    fn similarity(&self) -> bool {
        self.inner.similarity()
    }

    /// `"cpu"` or `"gpu"`: where the index lives.
    #[getter]
    fn device(&self) -> String {
        self.inner.device.to_string()
    }

    /// The `k` nearest fitted rows of each query row (`rows=None`: the fitted rows, each row's
    /// own pair left out): `(n, distances, indices)`, n × k float64 / int64 values row-major,
    /// nearest first; an empty slot (a NULL vector) is NaN / -1.
    #[pyo3(signature = (rows, k))]
    fn kneighbors<'py>(
        &self,
        py: Python<'py>,
        rows: Option<&Bound<'py, PyAny>>,
        k: usize,
    ) -> PyResult<(usize, Bound<'py, PyByteArray>, Bound<'py, PyByteArray>)> {
        let fitted = &self.inner;
        let query = self.query(py, rows)?;
        let searched = match query {
            Query::Given(_) => fitted.n_rows,
            Query::Fitted => fitted.n_rows.saturating_sub(1),
        };
        if k == 0 || k > searched {
            return Err(PyValueError::new_err(format!(
                "Expected n_neighbors <= n_samples_fit, but n_neighbors = {k}, n_samples_fit = \
                 {}, n_samples = {} ({})",
                fitted.n_rows,
                rows_of(fitted.query_rows(&query)),
                if matches!(query, Query::Fitted) {
                    "X=None: each row's own pair is left out"
                } else {
                    "k must be at least 1"
                }
            )));
        }
        let n = rows_of(fitted.query_rows(&query));
        let mut distances = vec![f64::NAN; n * k];
        let mut indices = vec![-1i64; n * k];
        py.detach(|| {
            fitted.probe_runs(&query, Selection::Nearest(k), PROBE_ROWS, |first, pairs| {
                let mut previous = u32::MAX;
                let mut rank = 0usize;
                for i in 0..pairs.len() {
                    let left = pairs.left[i];
                    rank = if left == previous { rank + 1 } else { 0 };
                    previous = left;
                    if rank >= k {
                        return exec_err!(
                            "a probe returned more than k = {k} pairs for row {left}"
                        );
                    }
                    let slot = (first + left as usize) * k + rank;
                    distances[slot] = pairs.distance[i];
                    indices[slot] = pairs.right[i] as i64;
                }
                Ok(())
            })
        })
        .map_err(value_error)?;
        let distances = bytes(py, distances);
        let indices = bytes(py, indices);
        Ok((n, distances, indices))
    }

    /// Every fitted row within `radius` (for a similarity: at least `radius`) of each query row
    /// (`rows=None`: the fitted rows, own pair left out): `(counts, distances, indices)`, the
    /// pairs a row has (int64) and the pairs row after row, nearest first, ties by row.
    #[pyo3(signature = (rows, radius))]
    fn radius_neighbors<'py>(
        &self,
        py: Python<'py>,
        rows: Option<&Bound<'py, PyAny>>,
        radius: f64,
    ) -> PyResult<(
        Bound<'py, PyByteArray>,
        Bound<'py, PyByteArray>,
        Bound<'py, PyByteArray>,
    )> {
        let fitted = &self.inner;
        if radius.is_nan() || (radius < 0.0 && !fitted.similarity()) {
            return Err(PyValueError::new_err(format!(
                "radius must be a number >= 0 for metric '{}', got {radius}",
                fitted.metric.name()
            )));
        }
        let query = self.query(py, rows)?;
        let n = rows_of(fitted.query_rows(&query));
        let similarity = fitted.similarity();
        let mut counts = vec![0i64; n];
        let mut pairs_all: Vec<(u32, f64)> = Vec::new();
        py.detach(|| {
            fitted.probe_runs(
                &query,
                Selection::Within(radius),
                PROBE_ROWS,
                |first, pairs| {
                    let mut start = 0;
                    while start < pairs.len() {
                        let left = pairs.left[start];
                        let mut end = start;
                        while end < pairs.len() && pairs.left[end] == left {
                            end += 1;
                        }
                        let at = pairs_all.len();
                        pairs_all.extend((start..end).map(|i| (pairs.right[i], pairs.distance[i])));
                        pairs_all[at..].sort_unstable_by(|a, b| {
                            let d = if similarity {
                                b.1.total_cmp(&a.1)
                            } else {
                                a.1.total_cmp(&b.1)
                            };
                            d.then(a.0.cmp(&b.0))
                        });
                        counts[first + left as usize] = (end - start) as i64;
                        start = end;
                    }
                    Ok(())
                },
            )
        })
        .map_err(value_error)?;
        let distances = bytes(py, pairs_all.iter().map(|p| p.1).collect::<Vec<f64>>());
        let indices = bytes(
            py,
            pairs_all.iter().map(|p| p.0 as i64).collect::<Vec<i64>>(),
        );
        let counts = bytes(py, counts);
        Ok((counts, distances, indices))
    }

    /// Every distance between the query rows (`rows=None`: the fitted rows, own pairs
    /// included) and the fitted rows: a bytearray of n × (fitted rows) float64 values,
    /// row-major, computed in blocks of query rows by the index's probe (every pair within an
    /// infinite radius) and written in place.
    #[pyo3(signature = (rows))]
    fn pairwise<'py>(
        &self,
        py: Python<'py>,
        rows: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(usize, Bound<'py, PyByteArray>)> {
        let fitted = &self.inner;
        let query = match self.query(py, rows)? {
            // The diagonal too: probe the fitted rows as given rows.
            Query::Fitted => Query::Given(fitted.rows.clone()),
            given => given,
        };
        let n = rows_of(fitted.query_rows(&query));
        let m = fitted.n_rows;
        let Some(bytes) = n.checked_mul(m).and_then(|c| c.checked_mul(8)) else {
            return Err(PyValueError::new_err(format!(
                "pairwise_distances: {n} x {m} does not fit an array"
            )));
        };
        let everything = if fitted.similarity() {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
        let block = (PAIRWISE_BLOCK_PAIRS / m.max(1)).clamp(1, PROBE_ROWS);
        let out = PyByteArray::new_with(py, bytes, |out: &mut [u8]| {
            py.detach(|| {
                // A pair a probe leaves out (a NULL vector) reads NaN.
                fill_f64(out, f64::NAN);
                fitted.probe_runs(
                    &query,
                    Selection::Within(everything),
                    block,
                    |first, pairs| {
                        for i in 0..pairs.len() {
                            let slot =
                                (first + pairs.left[i] as usize) * m + pairs.right[i] as usize;
                            put_f64(out, slot, pairs.distance[i]);
                        }
                        Ok(())
                    },
                )
            })
            .map_err(value_error)
        })?;
        Ok((n, out))
    }
}

impl FittedIndex {
    fn query(&self, py: Python<'_>, rows: Option<&Bound<'_, PyAny>>) -> PyResult<Query> {
        let fitted = &self.inner;
        match rows {
            None => Ok(Query::Fitted),
            Some(rows) => Ok(Query::Given(pieces(
                py,
                rows,
                &fitted.metric,
                "X",
                Side::Left,
                fitted.query_column.as_deref(),
            )?)),
        }
    }
}
