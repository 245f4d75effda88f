//! Python bindings of `datafusion-sparse-knn` (module `datafusion_sparse_knn._internal`).
//!
//! Two ways in, both thin layers over the main crate's public API:
//! - datafusion-python: every scalar function and the `knn_join` / `radius_join` table functions
//!   are exported through datafusion-ffi's PyCapsules (`__datafusion_scalar_udf__`,
//!   `__datafusion_table_function__`), which `SessionContext.register_udf` / `register_udtf`
//!   accept.
//! - Without DataFusion in Python: `kneighbors`, `radius_neighbors` and `join_table` run the
//!   crate's DataFrame-level `knn_join` / `radius_join` in a session of their own, on inputs held
//!   as [`Source`]s (Arrow data, which is how the package passes scipy matrices too, or a
//!   Parquet path), with the GIL released.
//!
//! The Python package (`python/python/datafusion_sparse_knn/__init__.py`) turns user inputs into
//! [`Source`]s and shapes the results like scikit-learn's.

use std::sync::{Arc, OnceLock};

use arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, Int64Array, RecordBatch, RecordBatchIterator,
    RecordBatchReader,
};
use arrow::datatypes::{
    DataType, Field, FieldRef, Float64Type, Int32Type, Int64Type, Schema, SchemaRef,
};
use arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::common::{exec_err, plan_err, DataFusionError, Result};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    TableType,
};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::udf::FFI_ScalarUDF;
use datafusion_ffi::udtf::FFI_TableFunction;
use datafusion_sparse_knn::planner::{self, SparseJoinFunction};
use datafusion_sparse_knn::MetricKind;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};
use tokio::runtime::Runtime;

/// Hidden row-position column added to both inputs of `kneighbors` / `radius_neighbors`: the
/// join's output order is not the input order, the row positions are what scikit-learn returns.
const ROW_ID: &str = "__sparse_knn_row";

/// One runtime for the module: the joins run on it (with the GIL released), and datafusion-ffi
/// enters it whenever datafusion-python executes one of our plans or polls one of our streams,
/// since the thread-local context of datafusion-python's own copy of tokio is not ours.
fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .thread_name("sparse-knn")
            .enable_all()
            .build()
            .expect("cannot start the tokio runtime")
    })
}

fn value_error(e: DataFusionError) -> PyErr {
    PyValueError::new_err(e.strip_backtrace())
}

// ---------------------------------------------------------------------------------------------
// Inputs

#[derive(Debug, Clone)]
enum Input {
    Memory {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    },
    Parquet(String),
}

/// One input of a join, built by the Python package from a matrix, Arrow data or a path.
#[pyclass(frozen, module = "datafusion_sparse_knn._internal")]
struct Source {
    input: Input,
}

#[pymethods]
impl Source {
    /// Arrow data: anything with `__arrow_c_stream__` (a pyarrow Table or RecordBatchReader, a
    /// polars DataFrame, ...), read once through the Arrow C stream interface (no copy).
    #[staticmethod]
    fn from_arrow(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let capsule = data.call_method0("__arrow_c_stream__")?;
        let capsule = capsule
            .cast::<PyCapsule>()
            .map_err(|_| PyValueError::new_err("__arrow_c_stream__ did not return a PyCapsule"))?;
        let pointer = capsule.pointer_checked(Some(c"arrow_array_stream"))?;
        // SAFETY: the capsule's name says it holds an ArrowArrayStream; from_raw moves the stream
        // out and leaves a released one behind, which the capsule's destructor then ignores.
        let reader = unsafe {
            ArrowArrayStreamReader::from_raw(pointer.as_ptr() as *mut FFI_ArrowArrayStream)
        }
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let schema = reader.schema();
        let batches = reader
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self {
            input: Input::Memory { schema, batches },
        })
    }

    /// A Parquet file or a folder of them, read when a join runs.
    #[staticmethod]
    fn from_parquet(path: String) -> Self {
        Self {
            input: Input::Parquet(path),
        }
    }

    /// Rows held in memory; None for a Parquet path (not read yet).
    #[getter]
    fn num_rows(&self) -> Option<usize> {
        match &self.input {
            Input::Memory { batches, .. } => Some(batches.iter().map(|b| b.num_rows()).sum()),
            Input::Parquet(_) => None,
        }
    }

    fn __repr__(&self) -> String {
        match &self.input {
            Input::Memory { schema, .. } => format!(
                "Source({} rows, columns {:?})",
                self.num_rows().unwrap_or(0),
                schema.fields().iter().map(|f| f.name()).collect::<Vec<_>>()
            ),
            Input::Parquet(path) => format!("Source(parquet {path:?})"),
        }
    }
}

fn parquet_options(path: &str) -> ParquetReadOptions<'static> {
    // A folder is read for its *.parquet files; a file is read whatever its name ends with.
    let extension = if std::path::Path::new(path).is_dir() {
        ".parquet"
    } else {
        ""
    };
    ParquetReadOptions::default().file_extension(extension)
}

async fn frame(ctx: &SessionContext, input: &Input) -> Result<DataFrame> {
    match input {
        Input::Memory { schema, batches } => {
            let table = MemTable::try_new(Arc::clone(schema), vec![batches.clone()])?;
            ctx.read_table(Arc::new(table))
        }
        Input::Parquet(path) => {
            if !std::path::Path::new(path).exists() {
                return plan_err!("'{path}' is not an existing Parquet file or folder");
            }
            ctx.read_parquet(path.as_str(), parquet_options(path)).await
        }
    }
}

/// `input` in memory with a [`ROW_ID`] column of row positions.
async fn with_row_ids(input: &Input) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let (schema, batches) = match input {
        Input::Memory { schema, batches } => (Arc::clone(schema), batches.clone()),
        Input::Parquet(_) => {
            // One partition keeps the file order (row positions are the answer here).
            let ctx =
                SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
            let df = frame(&ctx, input).await?;
            let schema = Arc::new(df.schema().as_arrow().clone());
            (schema, df.collect().await?)
        }
    };
    if schema.column_with_name(ROW_ID).is_some() {
        return plan_err!("the input already has a column named {ROW_ID}");
    }
    let mut fields = schema.fields().to_vec();
    fields.push(Arc::new(Field::new(ROW_ID, DataType::Int64, false)));
    let with_ids = Arc::new(Schema::new(fields));
    let mut next = 0i64;
    let batches = batches
        .into_iter()
        .map(|b| {
            let n = b.num_rows() as i64;
            let ids = Int64Array::from_iter_values(next..next + n);
            next += n;
            let mut columns = b.columns().to_vec();
            columns.push(Arc::new(ids));
            Ok(RecordBatch::try_new(Arc::clone(&with_ids), columns)?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((with_ids, batches))
}

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
struct ArrowStream {
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
fn kneighbors(
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
fn radius_neighbors(
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
fn join_table(
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

// ---------------------------------------------------------------------------------------------
// datafusion-python (FFI)

/// A scalar function as it is exported through datafusion-ffi 55, which hands every argument
/// over as an array, literals included (`'cosine'` arrives as a column of `'cosine'`). The
/// crate's functions want their metric, options, norm or dimension as constants, so an argument
/// of a non-nested type whose rows are all one non-NULL value is handed back as that scalar.
#[derive(Debug, PartialEq, Eq, Hash)]
struct ConstantArguments {
    inner: Arc<ScalarUDF>,
}

fn as_constant(value: ColumnarValue) -> Result<ColumnarValue> {
    let ColumnarValue::Array(array) = &value else {
        return Ok(value);
    };
    if array.is_empty() || array.null_count() > 0 || array.data_type().is_nested() {
        return Ok(value);
    }
    let first = ScalarValue::try_from_array(array, 0)?;
    let same = datafusion::arrow::compute::kernels::cmp::eq(&first.to_scalar()?, array)?;
    if same.true_count() == array.len() {
        Ok(ColumnarValue::Scalar(first))
    } else {
        Ok(value)
    }
}

impl ScalarUDFImpl for ConstantArguments {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn short_circuits(&self) -> bool {
        self.inner.short_circuits()
    }

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        args.args = args
            .args
            .into_iter()
            .map(as_constant)
            .collect::<Result<_>>()?;
        let all_scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let out = self.inner.invoke_with_args(args)?;
        // The caller had arrays; give it one row per input row back.
        match out {
            ColumnarValue::Scalar(s) if all_scalar => {
                Ok(ColumnarValue::Array(s.to_array_of_size(rows)?))
            }
            other => Ok(other),
        }
    }
}

/// One scalar function of the crate, exported to datafusion-python.
#[pyclass(frozen, module = "datafusion_sparse_knn._internal")]
struct ScalarFunction {
    udf: Arc<ScalarUDF>,
}

#[pymethods]
impl ScalarFunction {
    #[getter]
    fn name(&self) -> String {
        self.udf.name().to_string()
    }

    fn __datafusion_scalar_udf__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let udf = Arc::new(ScalarUDF::new_from_impl(ConstantArguments {
            inner: Arc::clone(&self.udf),
        }));
        let udf = FFI_ScalarUDF::from(udf);
        PyCapsule::new_with_value(py, udf, c"datafusion_scalar_udf")
    }

    fn __repr__(&self) -> String {
        format!("ScalarFunction({})", self.udf.name())
    }
}

/// `knn_join` / `radius_join` for datafusion-python: the call plans the join (argument checks,
/// output schema), and the scan resolves the input tables again, in the session that scans.
///
/// Why: datafusion-ffi 55's `ForeignTableFunction::call_with_args` (udtf.rs, run inside
/// datafusion-python) reads the runtime handle out of the exported function's private data,
/// which belongs to this library, and puts it, as a handle of datafusion-python's own build of
/// tokio (1.53, rustc 1.97 there; 1.54, rustc 1.95 here), into the session it hands the call.
/// Every table that the call looks up in that session's catalog carries that handle, and
/// datafusion-python enters it when it executes the table's scan: a Parquet, CSV or listing
/// table's object store then spawns its blocking reads through the other tokio's code onto our
/// runtime, and the process dies (SIGSEGV). In-memory scans never touch the runtime, which is
/// why they worked. Exporting no handle crashes sooner: that field is read with the other
/// build's layout of `Option<Handle>`, and our `None` does not come back as `None` there. The
/// session datafusion-python passes to `scan` is one it built itself with no handle, so tables
/// looked up there scan on datafusion-python's own runtime (the thread that polls them is one of
/// its workers, or inside its `block_on`), while our plan still enters ours through
/// datafusion-ffi.
#[derive(Debug)]
struct ResolvedAtScan {
    inner: Arc<dyn TableFunctionImpl>,
}

impl TableFunctionImpl for ResolvedAtScan {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let planned = self
            .inner
            .call_with_args(TableFunctionArgs::new(args.exprs(), args.session()))?;
        Ok(Arc::new(JoinResolvedAtScan {
            function: Arc::clone(&self.inner),
            args: args.exprs().to_vec(),
            schema: planned.schema(),
            table_type: planned.table_type(),
        }))
    }
}

/// A call of the join function, made again with the session of each scan.
#[derive(Debug)]
struct JoinResolvedAtScan {
    function: Arc<dyn TableFunctionImpl>,
    args: Vec<Expr>,
    schema: SchemaRef,
    table_type: TableType,
}

#[async_trait]
impl TableProvider for JoinResolvedAtScan {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        self.table_type
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let table = self
            .function
            .call_with_args(TableFunctionArgs::new(&self.args, state))?;
        if table.schema() != self.schema {
            return plan_err!(
                "an input of this join changed between planning and execution (its output \
                 columns are now {:?}); run the query again",
                table
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
            );
        }
        table.scan(state, projection, filters, limit).await
    }
}

/// `knn_join` or `radius_join` as a table function exported to datafusion-python. Its inputs are
/// table names of the calling session or Parquet paths, given as strings.
#[pyclass(frozen, module = "datafusion_sparse_knn._internal")]
struct TableFunction {
    name: &'static str,
    function: Arc<dyn TableFunctionImpl>,
}

/// The session's logical extension codec (datafusion-python hands a SessionContext, or the codec
/// capsule itself): datafusion-ffi decodes the call's arguments with it.
fn logical_codec(session: &Bound<'_, PyAny>) -> PyResult<FFI_LogicalExtensionCodec> {
    let attr = "__datafusion_logical_extension_codec__";
    let capsule = if session.hasattr(attr)? {
        session.getattr(attr)?.call0()?
    } else {
        session.clone()
    };
    let capsule = capsule.cast::<PyCapsule>().map_err(|_| {
        PyValueError::new_err(
            "expected a datafusion.SessionContext (or its logical extension codec capsule)",
        )
    })?;
    let pointer = capsule.pointer_checked(Some(c"datafusion_logical_extension_codec"))?;
    // SAFETY: the capsule's name guarantees it holds an FFI_LogicalExtensionCodec, alive as long
    // as the capsule, which we hold while cloning it.
    let codec = unsafe { pointer.cast::<FFI_LogicalExtensionCodec>().as_ref() };
    Ok(codec.clone())
}

#[pymethods]
impl TableFunction {
    #[getter]
    fn name(&self) -> &'static str {
        self.name
    }

    fn __datafusion_table_function__<'py>(
        &self,
        py: Python<'py>,
        session: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let codec = logical_codec(&session)?;
        let function = FFI_TableFunction::new_with_ffi_codec(
            Arc::new(ResolvedAtScan {
                inner: Arc::clone(&self.function),
            }),
            Some(runtime().handle().clone()),
            codec,
        );
        PyCapsule::new_with_value(py, function, c"datafusion_table_function")
    }

    fn __repr__(&self) -> String {
        format!("TableFunction({})", self.name)
    }
}

/// Every scalar function of the crate (`sparse_distance`, `sparse_parse`, ...).
#[pyfunction]
fn scalar_functions() -> Vec<ScalarFunction> {
    datafusion_sparse_knn::udf::functions()
        .into_iter()
        .map(|udf| ScalarFunction { udf })
        .collect()
}

/// `knn_join` and `radius_join`.
#[pyfunction]
fn table_functions() -> Vec<TableFunction> {
    vec![
        TableFunction {
            name: "knn_join",
            function: Arc::new(SparseJoinFunction::knn()),
        },
        TableFunction {
            name: "radius_join",
            function: Arc::new(SparseJoinFunction::radius()),
        },
    ]
}

#[pymodule]
fn _internal(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The joins' inputs may be datafusion-python's scans, which must be polled where
    // datafusion-python polls the join, not on our runtime's threads (see `ResolvedAtScan`).
    datafusion_sparse_knn::planner::poll_inputs_in_place();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Source>()?;
    m.add_class::<ArrowStream>()?;
    m.add_class::<ScalarFunction>()?;
    m.add_class::<TableFunction>()?;
    m.add_function(wrap_pyfunction!(kneighbors, m)?)?;
    m.add_function(wrap_pyfunction!(radius_neighbors, m)?)?;
    m.add_function(wrap_pyfunction!(join_table, m)?)?;
    m.add_function(wrap_pyfunction!(scalar_functions, m)?)?;
    m.add_function(wrap_pyfunction!(table_functions, m)?)?;
    Ok(())
}
