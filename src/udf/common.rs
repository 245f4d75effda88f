//! Helpers shared by the scalar functions: argument coercion that names the argument, scalar
//! broadcasting, and conversion of vector arguments through [`SparseBatch::try_from_array`].

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, StringArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::{exec_err, plan_err, Result, ScalarValue};
use datafusion::logical_expr::ColumnarValue;

use crate::vector::{is_sparse_vector_type, SparseBatch, VectorCheck, INDICES, VALUES};

/// `"sparse_distance argument 1"`: how messages and [`VectorCheck`] name an argument (1-based,
/// as a SQL user counts them).
pub(crate) fn arg_label(function: &str, position: usize) -> String {
    format!("{function} argument {}", position + 1)
}

/// Checks the argument count of a function with `min..=max` arguments.
pub(crate) fn check_arity(
    function: &str,
    usage: &str,
    types: &[DataType],
    min: usize,
    max: usize,
) -> Result<()> {
    if types.len() < min || types.len() > max {
        return plan_err!("{function} takes {usage}, got {} arguments", types.len());
    }
    Ok(())
}

fn is_integer(t: &DataType) -> bool {
    t.is_integer()
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// The same list kind with another item type (SQL array literals of integers become float lists).
fn relist(list: &DataType, item: DataType) -> DataType {
    match list {
        DataType::LargeList(f) => DataType::LargeList(Arc::new(Field::new(f.name(), item, true))),
        DataType::FixedSizeList(f, n) => {
            DataType::FixedSizeList(Arc::new(Field::new(f.name(), item, true)), *n)
        }
        DataType::List(f) => DataType::List(Arc::new(Field::new(f.name(), item, true))),
        other => other.clone(),
    }
}

fn list_item(t: &DataType) -> Option<&DataType> {
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            Some(f.data_type())
        }
        _ => None,
    }
}

const ACCEPTED_VECTORS: &str = "a sparse vector Struct{indices: List<Int32|UInt32|Int64>, values: \
List<Float32|Float64>}, a Map<Int32, Float32>, or a dense List/FixedSizeList of numbers";

/// Coercion of a vector argument: accepted types pass unchanged; integer values (SQL array
/// literals like `[1, 0, 2]`, or `named_struct('indices', [0], 'values', [1])`) are cast to Float64.
pub(crate) fn coerce_vector(function: &str, position: usize, t: &DataType) -> Result<DataType> {
    let numeric = |t: &DataType| is_integer(t) || is_float(t) || t == &DataType::Null;
    let coerced = match t {
        DataType::Null => Some(t.clone()),
        _ if is_sparse_vector_type(t) => Some(t.clone()),
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _) => list_item(t)
            .filter(|i| numeric(i))
            .map(|_| relist(t, DataType::Float64)),
        DataType::Struct(fields) => {
            let idx = fields.iter().find(|f| f.name() == INDICES);
            let val = fields.iter().find(|f| f.name() == VALUES);
            match (idx, val) {
                (Some(i), Some(v))
                    if list_item(i.data_type())
                        .is_some_and(|t| is_integer(t) || t == &DataType::Null)
                        && list_item(v.data_type()).is_some_and(numeric) =>
                {
                    let it = match list_item(i.data_type()) {
                        Some(DataType::Null) => DataType::Int32,
                        Some(t) => t.clone(),
                        None => unreachable!("checked above"),
                    };
                    Some(DataType::Struct(Fields::from(vec![
                        Field::new(INDICES, relist(i.data_type(), it), true),
                        Field::new(VALUES, relist(v.data_type(), DataType::Float64), true),
                    ])))
                }
                _ => None,
            }
        }
        _ => None,
    };
    match coerced {
        Some(c) => Ok(c),
        None => plan_err!(
            "{} has type {t}, which is not a sparse vector; accepted: {ACCEPTED_VECTORS}",
            arg_label(function, position)
        ),
    }
}

/// Coercion of a text argument to Utf8.
pub(crate) fn coerce_string(
    function: &str,
    position: usize,
    what: &str,
    t: &DataType,
) -> Result<DataType> {
    if is_string(t) || t == &DataType::Null {
        Ok(DataType::Utf8)
    } else {
        plan_err!(
            "{} ({what}) must be a string, got {t}",
            arg_label(function, position)
        )
    }
}

/// Coercion of an integer argument to Int64.
pub(crate) fn coerce_integer(
    function: &str,
    position: usize,
    what: &str,
    t: &DataType,
) -> Result<DataType> {
    if is_integer(t) || t == &DataType::Null {
        Ok(DataType::Int64)
    } else {
        plan_err!(
            "{} ({what}) must be an integer, got {t}",
            arg_label(function, position)
        )
    }
}

/// A list-of-numbers argument (sparse_vector's indices or values), coerced to a list of `item`.
pub(crate) fn coerce_number_list(
    function: &str,
    position: usize,
    what: &str,
    t: &DataType,
    integers_only: bool,
    item: DataType,
) -> Result<DataType> {
    if t == &DataType::Null {
        return Ok(DataType::new_list(item, true));
    }
    let ok = list_item(t)
        .is_some_and(|i| is_integer(i) || i == &DataType::Null || (!integers_only && is_float(i)));
    if ok {
        Ok(relist(t, item))
    } else {
        let kind = if integers_only { "integers" } else { "numbers" };
        plan_err!(
            "{} ({what}) must be a list of {kind}, got {t}",
            arg_label(function, position)
        )
    }
}

/// Arguments of one call, as arrays; scalars become one-row arrays that every row reads.
pub(crate) struct Args {
    arrays: Vec<ArrayRef>,
    scalar: Vec<bool>,
    rows: usize,
}

impl Args {
    pub fn new(args: &[ColumnarValue], number_rows: usize) -> Result<Self> {
        let mut arrays = Vec::with_capacity(args.len());
        let mut scalar = Vec::with_capacity(args.len());
        for a in args {
            match a {
                ColumnarValue::Array(arr) => {
                    arrays.push(Arc::clone(arr));
                    scalar.push(false);
                }
                ColumnarValue::Scalar(s) => {
                    arrays.push(s.to_array_of_size(1)?);
                    scalar.push(true);
                }
            }
        }
        let all_scalar = scalar.iter().all(|&s| s);
        Ok(Self {
            arrays,
            scalar,
            rows: if all_scalar { 1 } else { number_rows },
        })
    }

    /// Rows to produce: 1 when every argument is a scalar (the result is then a scalar too).
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn is_scalar(&self, i: usize) -> bool {
        self.scalar[i]
    }

    pub fn all_scalar(&self) -> bool {
        self.scalar.iter().all(|&s| s)
    }

    pub fn array(&self, i: usize) -> &ArrayRef {
        &self.arrays[i]
    }

    /// Which row of argument `i` output row `row` reads.
    #[inline]
    pub fn at(&self, i: usize, row: usize) -> usize {
        if self.scalar[i] {
            0
        } else {
            row
        }
    }

    /// Argument `i` as a validated sparse batch, named after the argument in errors.
    pub fn vector(
        &self,
        function: &str,
        i: usize,
        check: impl FnOnce(VectorCheck) -> VectorCheck,
    ) -> Result<SparseBatch> {
        SparseBatch::try_from_array(
            self.arrays[i].as_ref(),
            &check(VectorCheck::new(arg_label(function, i))),
        )
    }

    /// Argument `i` as Utf8 (coercion already made it Utf8; a Null-typed input is cast here).
    pub fn strings(&self, i: usize) -> Result<StringArray> {
        Ok(cast(&self.arrays[i], &DataType::Utf8)?
            .as_string::<i32>()
            .clone())
    }

    pub fn integers(&self, i: usize) -> Result<Int64Array> {
        Ok(cast(&self.arrays[i], &DataType::Int64)?
            .as_primitive()
            .clone())
    }

    /// Wraps a result of [`Args::rows`] rows as a scalar or an array like the inputs.
    pub fn output(&self, result: ArrayRef) -> Result<ColumnarValue> {
        if self.all_scalar() {
            Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
                &result, 0,
            )?))
        } else {
            Ok(ColumnarValue::Array(result))
        }
    }
}

/// A constant string argument (a metric name, an options string); `None` for a NULL literal.
pub(crate) fn constant_string(
    function: &str,
    position: usize,
    what: &str,
    arg: &ColumnarValue,
) -> Result<Option<String>> {
    let label = arg_label(function, position);
    match arg {
        ColumnarValue::Scalar(s) => match s {
            ScalarValue::Utf8(v) | ScalarValue::LargeUtf8(v) | ScalarValue::Utf8View(v) => {
                Ok(v.clone())
            }
            ScalarValue::Null => Ok(None),
            other => exec_err!(
                "{label} ({what}) must be a string, got {}",
                other.data_type()
            ),
        },
        ColumnarValue::Array(_) => {
            exec_err!("{label} ({what}) must be a constant string, not a column")
        }
    }
}

/// Picks `'l1'` or `'l2'` (case-insensitive) from a norm argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NormKind {
    L1,
    L2,
}

impl NormKind {
    pub fn parse(function: &str, position: usize, text: &str) -> Result<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "l1" => Ok(NormKind::L1),
            "l2" => Ok(NormKind::L2),
            _ => exec_err!(
                "{} (norm) must be 'l1' or 'l2', got '{text}'",
                arg_label(function, position)
            ),
        }
    }

    /// The norm of a row's values, in f64.
    pub fn of(self, values: &[f32]) -> f64 {
        match self {
            NormKind::L1 => values.iter().map(|&v| (v as f64).abs()).sum(),
            NormKind::L2 => values
                .iter()
                .map(|&v| (v as f64) * (v as f64))
                .sum::<f64>()
                .sqrt(),
        }
    }
}

/// The norm argument of sparse_norm / sparse_normalize: constant (the common case) or per row.
pub(crate) enum NormArg {
    Fixed(Option<NormKind>),
    PerRow(Vec<Option<NormKind>>),
}

impl NormArg {
    /// Argument `position` of `args`, or `'l2'` when the call leaves it out.
    pub fn from_args(function: &str, args: &Args, position: usize, count: usize) -> Result<Self> {
        if count <= position {
            return Ok(NormArg::Fixed(Some(NormKind::L2)));
        }
        let strings = args.strings(position)?;
        let mut parsed = Vec::with_capacity(strings.len());
        for s in strings.iter() {
            parsed.push(
                s.map(|s| NormKind::parse(function, position, s))
                    .transpose()?,
            );
        }
        if args.is_scalar(position) {
            return Ok(NormArg::Fixed(parsed[0]));
        }
        Ok(NormArg::PerRow(parsed))
    }

    /// The norm of output row `row` (`None` for a NULL norm argument).
    pub fn get(&self, row: usize) -> Option<NormKind> {
        match self {
            NormArg::Fixed(k) => *k,
            NormArg::PerRow(v) => v[row],
        }
    }
}
