//! The inputs of the functions without DataFusion: Arrow data or a Parquet path, held as a
//! [`Source`] until a join or a fit reads it.

use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, RecordBatchReader};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use datafusion::common::{plan_err, Result};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::MemTable;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};

/// Hidden row-position column added to both inputs of `kneighbors` / `radius_neighbors`: the
/// join's output order is not the input order, the row positions are what scikit-learn returns.
pub(crate) const ROW_ID: &str = "__sparse_knn_row";

#[derive(Debug, Clone)]
pub(crate) enum Input {
    Memory {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    },
    Parquet(String),
}

/// One input of a join, built by the Python package from a matrix, Arrow data or a path.
#[pyclass(frozen, module = "datafusion_sparse_knn._internal")]
pub(crate) struct Source {
    pub(crate) input: Input,
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

pub(crate) async fn frame(ctx: &SessionContext, input: &Input) -> Result<DataFrame> {
    match input {
        Input::Memory { schema, batches } => {
            let table = MemTable::try_new(Arc::clone(schema), vec![batches.clone()])?;
            ctx.read_table(Arc::new(table))
        }
        Input::Parquet(path) => {
            if !std::path::Path::new(path).exists() {
                return plan_err!("'{path}' is not an existing Parquet file or folder");
            }
            if datafusion_sparse_knn::index::is_index_path(path) {
                // An index file: its rows, and, as a join's right side, its stored index.
                return datafusion_sparse_knn::index::SparseIndex::open(path)?.dataframe(ctx);
            }
            ctx.read_parquet(path.as_str(), parquet_options(path)).await
        }
    }
}

/// `input` in memory with a [`ROW_ID`] column of row positions.
pub(crate) async fn with_row_ids(input: &Input) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let (schema, batches) = read_all(input).await?;
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

/// `input`'s record batches in row order (a Parquet path is read with one partition, which
/// keeps the file order).
pub(crate) async fn read_all(input: &Input) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    match input {
        Input::Memory { schema, batches } => Ok((Arc::clone(schema), batches.clone())),
        Input::Parquet(_) => {
            let ctx =
                SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1));
            let df = frame(&ctx, input).await?;
            let schema = Arc::new(df.schema().as_arrow().clone());
            Ok((schema, df.collect().await?))
        }
    }
}
