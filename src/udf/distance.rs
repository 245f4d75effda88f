//! `sparse_distance(a, b, metric [, options])`: the distance of two vectors, row by row, in
//! Float64, with the same metric definitions as the joins.
//!
//! `metric` and `options` are constant strings. Only the options that change a distance (`p`,
//! `dim`) are accepted here; their defaults are the session settings (`SET sparse_knn.p = 3`).
//! A NULL vector, metric or options string gives NULL.

use std::sync::Arc;

use arrow::array::Float64Array;
use arrow::datatypes::DataType;
use datafusion::common::{exec_err, DataFusionError, Result};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use super::common::{arg_label, check_arity, coerce_string, coerce_vector, constant_string, Args};
use crate::metric::Metric;
use crate::options::{JoinOptions, SparseKnnConfig};

const NAME: &str = "sparse_distance";

/// The option keys that bear on a single distance.
const DISTANCE_OPTION_KEYS: &[&str] = &["p", "dim"];

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SparseDistanceFunc {
    signature: Signature,
}

impl Default for SparseDistanceFunc {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

/// The metric of one call: session defaults, then the options string, then the name.
pub(crate) fn metric_for(
    config: &ConfigOptions,
    name: &str,
    options: Option<&str>,
) -> Result<Metric> {
    let defaults = config
        .extensions
        .get::<SparseKnnConfig>()
        .cloned()
        .unwrap_or_default();
    let mut opts = JoinOptions::from_config(&defaults)?;
    if let Some(text) = options {
        let label = format!("{} (options)", arg_label(NAME, 3));
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let key = item
                .split_once('=')
                .map_or(item, |(k, _)| k)
                .trim()
                .to_ascii_lowercase();
            if !DISTANCE_OPTION_KEYS.contains(&key.as_str()) {
                return exec_err!(
                    "{label}: unknown option '{key}'; valid keys for {NAME}: {}",
                    DISTANCE_OPTION_KEYS.join(", ")
                );
            }
        }
        opts = opts
            .apply(text)
            .map_err(|e| DataFusionError::Execution(format!("{label}: {}", e.strip_backtrace())))?;
    }
    opts.metric(name).map_err(|e| {
        DataFusionError::Execution(format!(
            "{} (metric): {}",
            arg_label(NAME, 2),
            e.strip_backtrace()
        ))
    })
}

impl ScalarUDFImpl for SparseDistanceFunc {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity(
            NAME,
            "3 or 4 arguments (a, b, metric [, options])",
            types,
            3,
            4,
        )?;
        let mut out = vec![
            coerce_vector(NAME, 0, &types[0])?,
            coerce_vector(NAME, 1, &types[1])?,
            coerce_string(NAME, 2, "metric", &types[2])?,
        ];
        if types.len() == 4 {
            out.push(coerce_string(NAME, 3, "options", &types[3])?);
        }
        Ok(out)
    }

    fn return_type(&self, _types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let metric_name = constant_string(NAME, 2, "metric", &args.args[2])?;
        let options = match args.args.get(3) {
            Some(o) => match constant_string(NAME, 3, "options", o)? {
                Some(o) => Some(o),
                None => return null_result(&args),
            },
            None => None,
        };
        let Some(metric_name) = metric_name else {
            return null_result(&args);
        };
        let metric = metric_for(&args.config_options, &metric_name, options.as_deref())?;
        let a = Args::new(&args.args[..2], args.number_rows)?;
        let nonnegative = metric.kind.needs_nonnegative().then(|| metric.name());
        let left = a.vector(NAME, 0, |c| {
            c.with_dim(metric.dim).with_nonnegative_for(nonnegative)
        })?;
        let right = a.vector(NAME, 1, |c| {
            c.with_dim(metric.dim).with_nonnegative_for(nonnegative)
        })?;
        let out: Float64Array = (0..a.rows())
            .map(|row| {
                let (l, r) = (a.at(0, row), a.at(1, row));
                (!left.is_null(l) && !right.is_null(r))
                    .then(|| metric.distance(left.row(l), right.row(r)))
            })
            .collect();
        a.output(Arc::new(out))
    }
}

fn null_result(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let all_scalar = args
        .args
        .iter()
        .all(|a| matches!(a, ColumnarValue::Scalar(_)));
    if all_scalar {
        Ok(ColumnarValue::Scalar(
            datafusion::common::ScalarValue::Float64(None),
        ))
    } else {
        Ok(ColumnarValue::Array(Arc::new(Float64Array::new_null(
            args.number_rows,
        ))))
    }
}
