//! `kneighbors`, `radius_neighbors` and `join_table`: the crate's DataFrame-level `knn_join` /
//! `radius_join` in a session of their own, over row-numbered inputs, with the GIL released.
//! Each call builds its right side; `FittedIndex` (fitted.rs) keeps one built.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Float64Array, Int64Array, RecordBatch, RecordBatchIterator};
use arrow::datatypes::{Float64Type, Int32Type, Int64Type, SchemaRef};
use arrow::ffi_stream::FFI_ArrowArrayStream;
use datafusion::common::{exec_err, plan_err, Result};
use datafusion::dataframe::DataFrame;
use datafusion_sparse_knn::planner;
use datafusion_sparse_knn::MetricKind;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::source::{frame, with_row_ids, Input, Source, ROW_ID};
use crate::{runtime, value_error};

#[derive(Debug, Clone, Copy)]
enum Kind {
    Knn(usize),
    Radius(f64),
}

fn kind(function: &str, param: f64) -> Result<Kind> {
    match function {
        "knn" => {
            if !(param.is_finite() && param >= 1.0 && param.fract() == 0.0) {
                return plan_err!("knn_join: k must be a whole number >= 1, got {param}");
            }
            Ok(Kind::Knn(param as usize))
        }
        "radius" => Ok(Kind::Radius(param)),
        other => exec_err!("unknown join '{other}'"),
    }
}

/// The join of `left` and `right` (`None`: `left` again, one table on both sides) as a
/// DataFrame in a session of its own with every function registered.
async fn join_frame(
    left: &Input,
    right: Option<&Input>,
    kind: Kind,
    metric: &str,
    options: &str,
) -> Result<DataFrame> {
    let ctx = datafusion_sparse_knn::session_context();
    let l = frame(&ctx, left).await?;
    let r = match right {
        Some(r) => frame(&ctx, r).await?,
        None => l.clone(),
    };
    match kind {
        Kind::Knn(k) => planner::knn_join(l, r, metric, k, options),
        Kind::Radius(radius) => planner::radius_join(l, r, metric, radius, options),
    }
}

fn in_memory(schema: SchemaRef, batches: Vec<RecordBatch>) -> Input {
    Input::Memory { schema, batches }
}

/// Pairs `(query row, neighbour row, distance, rank)` of a join over row-numbered inputs.
struct Pairs {
    left_rows: usize,
    batches: Vec<RecordBatch>,
}

async fn pairs(
    left: &Input,
    right: Option<&Input>,
    kind: Kind,
    metric: &str,
    options: &str,
) -> Result<Pairs> {
    let (ls, lb) = with_row_ids(left).await?;
    let left_rows = lb.iter().map(|b| b.num_rows()).sum();
    let left = in_memory(ls, lb);
    let (right, right_rows) = match right {
        Some(r) => {
            let (rs, rb) = with_row_ids(r).await?;
            let n = rb.iter().map(|b| b.num_rows()).sum();
            (Some(in_memory(rs, rb)), n)
        }
        None => (None, left_rows),
    };
    if let Kind::Knn(k) = kind {
        if k > right_rows {
            return plan_err!(
                "k = {k} is more than the {right_rows} rows searched (scikit-learn: Expected \
                 n_neighbors <= n_samples_fit)"
            );
        }
    }
    let mut columns = vec![
        format!("{}{ROW_ID}", planner::QUERY_PREFIX),
        format!("{}{ROW_ID}", planner::NEIGHBOR_PREFIX),
        planner::DISTANCE_COLUMN.to_string(),
    ];
    if matches!(kind, Kind::Knn(_)) {
        columns.push(planner::RANK_COLUMN.to_string());
    }
    let columns: Vec<&str> = columns.iter().map(String::as_str).collect();
    let df = join_frame(&left, right.as_ref(), kind, metric, options)
        .await?
        .select_columns(&columns)?;
    Ok(Pairs {
        left_rows,
        batches: df.collect().await?,
    })
}

/// Record batches handed to Python through the Arrow C stream interface (`__arrow_c_stream__`),
/// which pyarrow, polars and others import without a copy.
#[pyclass(frozen, module = "datafusion_sparse_knn._internal")]
pub(crate) struct ArrowStream {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
}

#[pymethods]
impl ArrowStream {
    /// Every call exports the batches again (they are shared, not copied).
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // The schema is what it is; a consumer casts if it wants another one.
        let _ = requested_schema;
        let reader = RecordBatchIterator::new(
            self.batches.clone().into_iter().map(Ok),
            Arc::clone(&self.schema),
        );
        let stream = FFI_ArrowArrayStream::new(Box::new(reader));
        PyCapsule::new_with_value(py, stream, c"arrow_array_stream")
    }
}

fn stream(columns: Vec<(&str, ArrayRef)>) -> ArrowStream {
    let batch = RecordBatch::try_from_iter(columns).expect("columns of one length");
    ArrowStream {
        schema: batch.schema(),
        batches: vec![batch],
    }
}

/// `k` neighbours per query row, nearest first, row-major as columns `distance` and `index`;
/// slots a query row does not fill (a NULL vector matches nothing) are NaN / -1.
fn knn_arrays(pairs: &Pairs, k: usize) -> Result<ArrowStream> {
    let n = pairs.left_rows;
    let mut distances = vec![f64::NAN; n * k];
    let mut indices = vec![-1i64; n * k];
    for batch in &pairs.batches {
        let q = batch.column(0).as_primitive::<Int64Type>();
        let j = batch.column(1).as_primitive::<Int64Type>();
        let d = batch.column(2).as_primitive::<Float64Type>();
        let r = batch.column(3).as_primitive::<Int32Type>();
        for row in 0..batch.num_rows() {
            let rank = r.value(row) as usize;
            let query = q.value(row) as usize;
            if rank == 0 || rank > k || query >= n {
                return exec_err!("knn_join returned rank {rank} for query row {query}");
            }
            let slot = query * k + rank - 1;
            distances[slot] = d.value(row);
            indices[slot] = j.value(row);
        }
    }
    Ok(stream(vec![
        ("distance", Arc::new(Float64Array::from(distances))),
        ("index", Arc::new(Int64Array::from(indices))),
    ]))
}

/// Every pair as columns `query`, `distance`, `index`, by query row, nearest first (largest
/// first for a similarity), then by neighbour row.
fn radius_arrays(pairs: &Pairs, similarity: bool) -> ArrowStream {
    let mut all: Vec<(i64, f64, i64)> = Vec::new();
    for batch in &pairs.batches {
        let q = batch.column(0).as_primitive::<Int64Type>();
        let j = batch.column(1).as_primitive::<Int64Type>();
        let d = batch.column(2).as_primitive::<Float64Type>();
        all.extend((0..batch.num_rows()).map(|i| (q.value(i), d.value(i), j.value(i))));
    }
    all.sort_unstable_by(|a, b| {
        let by_distance = if similarity {
            b.1.total_cmp(&a.1)
        } else {
            a.1.total_cmp(&b.1)
        };
        a.0.cmp(&b.0).then(by_distance).then(a.2.cmp(&b.2))
    });
    stream(vec![
        (
            "query",
            Arc::new(Int64Array::from_iter_values(all.iter().map(|p| p.0))),
        ),
        (
            "distance",
            Arc::new(Float64Array::from_iter_values(all.iter().map(|p| p.1))),
        ),
        (
            "index",
            Arc::new(Int64Array::from_iter_values(all.iter().map(|p| p.2))),
        ),
    ])
}

fn inputs(left: &Bound<'_, Source>, right: Option<&Bound<'_, Source>>) -> (Input, Option<Input>) {
    let l = left.get().input.clone();
    // The same Python object on both sides is one table (what exclude_self counts rows over).
    let r = right.filter(|r| !r.is(left)).map(|r| r.get().input.clone());
    (l, r)
}

/// For each row of `left`, its `k` nearest rows of `right` (None: `left` itself): the number of
/// rows of `left` and the columns `distance` / `index`, (rows of `left`) × k values row-major.
#[pyfunction]
#[pyo3(signature = (left, right, metric, k, options))]
pub(crate) fn kneighbors(
    py: Python<'_>,
    left: &Bound<'_, Source>,
    right: Option<&Bound<'_, Source>>,
    metric: &str,
    k: i64,
    options: &str,
) -> PyResult<(usize, ArrowStream)> {
    let (l, r) = inputs(left, right);
    let kind = kind("knn", k as f64).map_err(value_error)?;
    let Kind::Knn(k) = kind else {
        unreachable!("kind(\"knn\", ..) is a knn join")
    };
    py.detach(|| {
        runtime().block_on(async {
            let pairs = pairs(&l, r.as_ref(), kind, metric, options).await?;
            Ok((pairs.left_rows, knn_arrays(&pairs, k)?))
        })
    })
    .map_err(value_error)
}

/// Every row of `right` within `radius` of each row of `left`: the number of rows of `left` and
/// the pairs as columns `query`, `distance`, `index`, by query row and nearest first.
#[pyfunction]
#[pyo3(signature = (left, right, metric, radius, options))]
pub(crate) fn radius_neighbors(
    py: Python<'_>,
    left: &Bound<'_, Source>,
    right: Option<&Bound<'_, Source>>,
    metric: &str,
    radius: f64,
    options: &str,
) -> PyResult<(usize, ArrowStream)> {
    let (l, r) = inputs(left, right);
    // An unknown name is reported by the join itself, with the list of valid ones.
    let similarity = metric
        .parse::<MetricKind>()
        .is_ok_and(|m| m.is_similarity());
    py.detach(|| {
        runtime().block_on(async {
            let pairs = pairs(&l, r.as_ref(), Kind::Radius(radius), metric, options).await?;
            Ok((pairs.left_rows, radius_arrays(&pairs, similarity)))
        })
    })
    .map_err(value_error)
}

/// `knn_join` (`function = "knn"`, `param` = k) or `radius_join` (`"radius"`, `param` = radius)
/// with the SQL output columns.
#[pyfunction]
#[pyo3(signature = (left, right, function, metric, param, options))]
pub(crate) fn join_table(
    py: Python<'_>,
    left: &Bound<'_, Source>,
    right: Option<&Bound<'_, Source>>,
    function: &str,
    metric: &str,
    param: f64,
    options: &str,
) -> PyResult<ArrowStream> {
    let (l, r) = inputs(left, right);
    let kind = kind(function, param).map_err(value_error)?;
    py.detach(|| {
        runtime().block_on(async {
            let df = join_frame(&l, r.as_ref(), kind, metric, options).await?;
            let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
            let batches = df.collect().await?;
            Ok(ArrowStream { schema, batches })
        })
    })
    .map_err(value_error)
}
