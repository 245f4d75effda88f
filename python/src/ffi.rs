//! datafusion-python: the crate's scalar functions and `knn_join` / `radius_join` exported
//! through datafusion-ffi's PyCapsules.

use std::sync::Arc;

use arrow::array::Array;
use arrow::datatypes::{DataType, FieldRef, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, Result, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    TableType,
};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::udf::FFI_ScalarUDF;
use datafusion_ffi::udtf::FFI_TableFunction;
use datafusion_sparse_knn::planner::SparseJoinFunction;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};

use crate::runtime;

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
pub(crate) struct ScalarFunction {
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
pub(crate) struct TableFunction {
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
pub(crate) fn scalar_functions() -> Vec<ScalarFunction> {
    datafusion_sparse_knn::udf::functions()
        .into_iter()
        .map(|udf| ScalarFunction { udf })
        .collect()
}

/// `knn_join` and `radius_join`.
#[pyfunction]
pub(crate) fn table_functions() -> Vec<TableFunction> {
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
