//! `FittedIndex`: the right side built once and probed directly by query rows, without a
//! DataFusion plan, for the estimator `NearestNeighbors`, `KNeighborsTransformer`, the graphs and
//! `pairwise_distances`.
//!
//! The built side is the crate's [`SparseIndex`] (`src/index`): the fitted rows read, checked
//! and indexed once (on the CPU or a GPU), probed without a plan, saved to and opened from
//! index files (`.skidx`). Probes are cut into the planner's probe size; results come back as
//! `bytearray`s that the package wraps as numpy arrays (no copy).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch};
use arrow::buffer::Buffer;
use arrow::datatypes::{ArrowNativeType, DataType, Field, Schema, SchemaRef};
use datafusion::common::{exec_err, Result};
use datafusion::prelude::SessionContext;
use datafusion_sparse_knn::index::SparseIndex;
use datafusion_sparse_knn::join::{
    max_chunk_nnz, GroupMembers, GroupedProbe, PairList, ProbeOptions, Selection,
};
use datafusion_sparse_knn::options::{ExcludeSelf, JoinOptions};
use datafusion_sparse_knn::planner::{find_vector_column, Device, Side};
use datafusion_sparse_knn::vector::{sparse_vector_type, VectorCheck};
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

/// The right side as built for probing: the crate's index value.
struct Built {
    index: SparseIndex,
}

impl Built {
    fn probe(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
    ) -> Result<PairList> {
        self.index.probe(left, selection, options)
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
    /// `within=` labels given to `fit`: the fitted rows' groups.
    groups: Option<GroupMembers>,
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
pub(crate) fn pieces(
    py: Python<'_>,
    rows: &Bound<'_, PyAny>,
    metric: &Metric,
    what: &str,
    side: Side,
    column: Option<&str>,
) -> PyResult<Vec<SparseBatch>> {
    if let Ok(csr) = rows.cast::<Csr>() {
        let csr = csr.get();
        let check = check(metric, what);
        return py.detach(|| csr.pieces(&check)).map_err(value_error);
    }
    let (schema, batches) = batches_of(py, rows, what)?;
    py.detach(|| convert(&schema, &batches, metric, what, side, column))
        .map_err(value_error)
}

/// `rows` as record batches: a [`Csr`] as one column `vector`, a [`Source`] read whole.
fn batches_of(
    py: Python<'_>,
    rows: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<(SchemaRef, Vec<RecordBatch>)> {
    if let Ok(csr) = rows.cast::<Csr>() {
        // `row` (the row position) beside the vectors, as a matrix has it everywhere in the
        // package: an index file saved from here names its rows in a join's output.
        let vectors = Arc::clone(&csr.get().vectors);
        let schema = Arc::new(Schema::new(vec![
            Field::new("row", DataType::Int64, false),
            Field::new("vector", vectors.data_type().clone(), false),
        ]));
        let rows = Arc::new(Int64Array::from_iter_values(0..vectors.len() as i64));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![rows, vectors])
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        return Ok((schema, vec![batch]));
    }
    let Ok(source) = rows.cast::<Source>() else {
        return Err(PyValueError::new_err(format!(
            "{what}: expected rows as a Csr or a Source, got {}",
            rows.get_type().name()?
        )));
    };
    let input = source.get().input.clone();
    py.detach(|| runtime().block_on(read_all(&input)))
        .map_err(value_error)
}

/// Converted rows of a matrix as record batches: `row` (the row position) and `vector` in the
/// canonical layout (no copy).
fn canonical_batches(pieces: &[SparseBatch]) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let nullable = pieces.iter().any(|p| p.nulls().is_some());
    let schema = Arc::new(Schema::new(vec![
        Field::new("row", DataType::Int64, false),
        Field::new("vector", sparse_vector_type(), nullable),
    ]));
    let mut first = 0i64;
    let mut batches = Vec::with_capacity(pieces.len());
    for piece in pieces {
        let rows = Int64Array::from_iter_values(first..first + piece.len() as i64);
        first += piece.len() as i64;
        let columns: Vec<ArrayRef> = vec![Arc::new(rows), Arc::new(piece.to_array())];
        batches.push(RecordBatch::try_new(Arc::clone(&schema), columns)?);
    }
    Ok((schema, batches))
}

/// The vector column of `batches` converted and checked for `metric`, in pieces.
fn convert(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    metric: &Metric,
    what: &str,
    side: Side,
    column: Option<&str>,
) -> Result<Vec<SparseBatch>> {
    let vector = find_vector_column(what, side, schema, column)?;
    let check = check(metric, schema.field(vector).name());
    let mut out = Vec::new();
    let mut row = 0u64;
    for batch in batches {
        out.extend(SparseBatch::try_from_array_chunked(
            batch.column(vector).as_ref(),
            &check.clone().with_first_row(row),
            max_chunk_nnz(),
        )?);
        row += batch.num_rows() as u64;
    }
    Ok(out)
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

    /// Every probe of `query` with `selection`, `visit(first row of the run, its rows, its
    /// pairs)` in row
    /// order; runs of at most `most` rows.
    /// `groups`: the query rows' groups (`within=`), each row's pairs with the fitted rows of
    /// its own group only.
    fn probe_runs(
        &self,
        query: &Query,
        groups: Option<&[u32]>,
        selection: Selection,
        most: usize,
        mut visit: impl FnMut(usize, usize, PairList) -> Result<()>,
    ) -> Result<()> {
        for (first, run) in runs(self.query_rows(query), most) {
            let options = ProbeOptions {
                exclude_self_from: matches!(query, Query::Fitted).then_some(first as i64),
            };
            let pairs = match (groups, &self.groups) {
                (Some(left), Some(members)) => self.built.index.probe_grouped_metric(
                    &self.metric,
                    &run,
                    GroupedProbe::new(&left[first..first + run.len()], members, None),
                    selection,
                    options,
                )?,
                _ => self.built.probe(&run, selection, options)?,
            };
            visit(first, run.len(), pairs)?;
        }
        Ok(())
    }

    fn similarity(&self) -> bool {
        self.metric.kind.is_similarity()
    }

    /// The fitted rows' k nearest among themselves where the index's backend answers them
    /// directly, bit for bit as the probe would (on the CPU, from the symmetric dense block,
    /// each pair once: raw counts under cosine, euclidean, sqeuclidean or manhattan). False:
    /// probe.
    fn self_nearest(&self, query: &Query, k: usize, out: (&mut [f64], &mut [i64])) -> Result<bool> {
        match query {
            Query::Fitted => self.built.index.self_nearest(&self.metric, k, out),
            Query::Given(_) => Ok(false),
        }
    }
}

/// `within=` labels: the one column of `labels` (a `Source`), a value for each of `rows` rows.
fn labels_of(py: Python<'_>, labels: &Bound<'_, PyAny>, rows: usize) -> PyResult<ArrayRef> {
    let Ok(source) = labels.cast::<Source>() else {
        return Err(PyValueError::new_err(format!(
            "within: expected labels as a Source, got {}",
            labels.get_type().name()?
        )));
    };
    let input = source.get().input.clone();
    let (schema, batches) = py
        .detach(|| runtime().block_on(read_all(&input)))
        .map_err(value_error)?;
    if schema.fields().len() != 1 {
        return Err(PyValueError::new_err(format!(
            "within: labels are one column, got {}",
            schema.fields().len()
        )));
    }
    let columns: Vec<&dyn Array> = batches.iter().map(|b| b.column(0).as_ref()).collect();
    let labels = if columns.is_empty() {
        arrow::array::new_empty_array(schema.field(0).data_type())
    } else {
        arrow::compute::concat(&columns).map_err(|e| PyValueError::new_err(e.to_string()))?
    };
    if labels.len() != rows {
        return Err(PyValueError::new_err(format!(
            "within: {rows} rows but {} labels",
            labels.len()
        )));
    }
    Ok(labels)
}

pub(crate) fn rows_of(pieces: &[SparseBatch]) -> usize {
    pieces.iter().map(SparseBatch::len).sum()
}

/// `values` as a bytearray (native byte order), which the package wraps as a writable numpy
/// array without a copy.
fn bytes<T: ArrowNativeType>(py: Python<'_>, values: Vec<T>) -> Bound<'_, PyByteArray> {
    PyByteArray::new(py, Buffer::from_vec(values).as_slice())
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
    /// `groups`: `within=` labels of the rows (a `Source` of one column, a value a row).
    #[pyo3(signature = (rows, metric, options, groups=None))]
    fn fit(
        py: Python<'_>,
        rows: &Bound<'_, PyAny>,
        metric: &str,
        options: &str,
        groups: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let opts = JoinOptions::default().apply(options).map_err(value_error)?;
        if !matches!(opts.exclude_self, ExcludeSelf::Off) {
            return Err(PyValueError::new_err(
                "NearestNeighbors: option exclude_self does not apply; kneighbors(X=None) leaves \
                 each fitted row's own pair out, as scikit-learn does",
            ));
        }
        let name = metric;
        let metric = opts.metric(name).map_err(value_error)?;
        let (schema, batches) = batches_of(py, rows, "Y")?;
        let column = opts.right_column.as_deref();
        let pieces = py
            .detach(|| convert(&schema, &batches, &metric, "Y", Side::Right, column))
            .map_err(value_error)?;
        let n_rows = rows_of(&pieces);
        if n_rows == 0 {
            return Err(PyValueError::new_err(
                "NearestNeighbors.fit: found array with 0 sample(s); at least 1 is required",
            ));
        }
        // A matrix's rows go to the index as converted just now (the canonical layout, which
        // it takes without converting again): a fit of the PBMC cut converted its float64
        // values three times, a third of the fit.
        let (schema, batches) = if rows.cast::<Csr>().is_ok() {
            canonical_batches(&pieces).map_err(value_error)?
        } else {
            (schema, batches)
        };
        let groups = match groups {
            Some(labels) => {
                let labels = labels_of(py, labels, n_rows)?;
                Some(
                    py.detach(|| GroupMembers::build(&labels))
                        .map_err(value_error)?,
                )
            }
            None => None,
        };
        let index = py
            .detach(|| SparseIndex::from_batches(schema, batches, &[name], &opts))
            .map_err(value_error)?;
        Ok(Self::new(
            index,
            metric,
            pieces,
            opts.left_column.clone(),
            groups,
        ))
    }

    /// Opens an index file (`.skidx`, from `save` or `sparse-knn index`): nothing is rebuilt.
    /// `options`: where to probe it (`device=`, default the CPU) and `left_column`.
    #[staticmethod]
    #[pyo3(signature = (path, options))]
    fn load(py: Python<'_>, path: &str, options: &str) -> PyResult<Self> {
        let opts = JoinOptions::default().apply(options).map_err(value_error)?;
        let path = path.to_string();
        let (index, pieces) = py
            .detach(|| {
                let index = SparseIndex::open_with(&path, &opts)?;
                let metric = index.metrics()[0];
                // The stored rows, converted once: kneighbors(X=None) probes them.
                let ctx = SessionContext::new();
                let batches = runtime().block_on(index.dataframe(&ctx)?.collect())?;
                let schema = index.schema();
                let pieces = convert(&schema, &batches, &metric, "rows", Side::Right, None)?;
                Ok((index, pieces))
            })
            .map_err(value_error)?;
        let metric = index.metrics()[0];
        Ok(Self::new(
            index,
            metric,
            pieces,
            opts.left_column.clone(),
            None,
        ))
    }

    /// Writes the index file: the fitted rows and their index; returns the bytes written.
    fn save(&self, py: Python<'_>, path: &str) -> PyResult<u64> {
        let index = &self.inner.built.index;
        py.detach(|| index.save(path)).map_err(value_error)
    }

    /// The metric's `p` (minkowski) and `dim`, as the index was built with them.
    #[getter]
    fn params(&self) -> (f64, Option<u64>) {
        (self.inner.metric.p, self.inner.metric.dim)
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
    /// `groups`: `within=` labels of the query rows (see `fit`; `rows=None` takes the fitted
    /// rows' own); a query row's slots past its group's rows are empty.
    #[pyo3(signature = (rows, k, groups=None))]
    fn kneighbors<'py>(
        &self,
        py: Python<'py>,
        rows: Option<&Bound<'py, PyAny>>,
        k: usize,
        groups: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(usize, Bound<'py, PyByteArray>, Bound<'py, PyByteArray>)> {
        let fitted = &self.inner;
        let query = self.query(py, rows)?;
        let groups = self.groups_of(py, &query, groups)?;
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
            if groups.is_none() && fitted.self_nearest(&query, k, (&mut distances, &mut indices))? {
                return Ok(());
            }
            fitted.probe_runs(
                &query,
                groups.as_deref(),
                Selection::Nearest(k),
                PROBE_ROWS,
                |first, _, pairs| {
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
                },
            )
        })
        .map_err(value_error)?;
        let distances = bytes(py, distances);
        let indices = bytes(py, indices);
        Ok((n, distances, indices))
    }

    /// Every fitted row within `radius` (for a similarity: at least `radius`) of each query row
    /// (`rows=None`: the fitted rows, own pair left out): `(counts, distances, indices)`, the
    /// pairs a row has (int64) and the pairs row after row, nearest first, ties by row.
    #[pyo3(signature = (rows, radius, groups=None))]
    fn radius_neighbors<'py>(
        &self,
        py: Python<'py>,
        rows: Option<&Bound<'py, PyAny>>,
        radius: f64,
        groups: Option<&Bound<'py, PyAny>>,
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
        let groups = self.groups_of(py, &query, groups)?;
        let n = rows_of(fitted.query_rows(&query));
        let similarity = fitted.similarity();
        let mut counts = vec![0i64; n];
        let mut pairs_all: Vec<(u32, f64)> = Vec::new();
        py.detach(|| {
            fitted.probe_runs(
                &query,
                groups.as_deref(),
                Selection::Within(radius),
                PROBE_ROWS,
                |first, _, pairs| {
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
    /// included, each pair computed once where the metric allows) and the fitted rows: a
    /// C-contiguous float64 numpy array of shape (n, fitted rows), NaN where either row is NULL,
    /// written in place by the index's distance matrix (the backend's own operation: the CPU's
    /// dense blocks, the GPU's matrix kernel, or a probe within an infinite radius).
    #[pyo3(signature = (rows))]
    fn pairwise<'py>(
        &self,
        py: Python<'py>,
        rows: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fitted = &self.inner;
        let query = self.query(py, rows)?;
        let n = rows_of(fitted.query_rows(&query));
        let m = fitted.n_rows;
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
        if n * m == 0 {
            return Ok(array);
        }
        // SAFETY: `array` is the C-contiguous float64 array of n × m values just made, held
        // here and by no one else while it is written (numpy aligns its data to 16 bytes).
        let out = unsafe { std::slice::from_raw_parts_mut(address as *mut f64, n * m) };
        py.detach(|| -> Result<()> {
            let index = &fitted.built.index;
            match &query {
                Query::Fitted => index.distance_matrix(&fitted.metric, None, out),
                Query::Given(pieces) => {
                    let mut first = 0;
                    for piece in pieces.iter().filter(|p| !p.is_empty()) {
                        let rows = &mut out[first * m..(first + piece.len()) * m];
                        index.distance_matrix(&fitted.metric, Some(piece), rows)?;
                        first += piece.len();
                    }
                    Ok(())
                }
            }
        })
        .map_err(value_error)?;
        Ok(array)
    }
}

impl FittedIndex {
    fn new(
        index: SparseIndex,
        metric: Metric,
        rows: Vec<SparseBatch>,
        query_column: Option<String>,
        groups: Option<GroupMembers>,
    ) -> Self {
        Self {
            inner: Arc::new(Fitted {
                device: index.device(),
                n_rows: index.rows(),
                built: Built { index },
                metric,
                rows,
                query_column,
                groups,
            }),
        }
    }

    /// The query rows' groups for a `within=` call: from `labels`, or the fitted rows' own for
    /// `rows=None`; None where the index was fitted without labels and none are given.
    fn groups_of(
        &self,
        py: Python<'_>,
        query: &Query,
        labels: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Vec<u32>>> {
        let fitted = &self.inner;
        match (&fitted.groups, labels, query) {
            (None, None, _) => Ok(None),
            (None, Some(_), _) => Err(PyValueError::new_err(
                "within: the index was fitted without within= labels; fit(X, within=labels) to \
                 search within groups",
            )),
            (Some(members), None, Query::Fitted) => Ok(Some(members.right_groups().to_vec())),
            (Some(_), None, Query::Given(_)) => Err(PyValueError::new_err(
                "within: the index was fitted with within= labels; pass within= labels of X's \
                 rows too",
            )),
            (Some(members), Some(labels), _) => {
                let labels = labels_of(py, labels, rows_of(fitted.query_rows(query)))?;
                Ok(Some(
                    py.detach(|| members.left_groups(&labels))
                        .map_err(value_error)?,
                ))
            }
        }
    }

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
