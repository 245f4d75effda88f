//! `sparse_format(v [, d])`: a sparse vector as pgvector's sparsevec text `'{1:0.5,3:2}/5'`.
//!
//! The column carries no dimension: without `d` the text uses the largest index + 1 (at least
//! 1, since pgvector rejects a zero dimension). Entries are written sorted by 1-based index, with
//! the shortest decimal that reads back as the same float32.

use std::fmt::Write;
use std::sync::Arc;

use arrow::array::{Array, StringBuilder};
use arrow::datatypes::DataType;
use datafusion::common::{exec_err, Result};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use super::common::{arg_label, check_arity, coerce_integer, coerce_vector, Args};

const NAME: &str = "sparse_format";

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SparseFormatFunc {
    signature: Signature,
}

impl Default for SparseFormatFunc {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SparseFormatFunc {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity(NAME, "1 or 2 arguments (vector [, dimension])", types, 1, 2)?;
        let mut out = vec![coerce_vector(NAME, 0, &types[0])?];
        if types.len() == 2 {
            out.push(coerce_integer(NAME, 1, "dimension", &types[1])?);
        }
        Ok(out)
    }

    fn return_type(&self, _types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n_args = args.args.len();
        let a = Args::new(&args.args, args.number_rows)?;
        let batch = a.vector(NAME, 0, |c| c)?;
        let dims = if n_args == 2 {
            Some(a.integers(1)?)
        } else {
            None
        };
        let mut out = StringBuilder::new();
        let mut entries: Vec<(i32, f32)> = Vec::new();
        let mut text = String::new();
        for row in 0..a.rows() {
            let vr = a.at(0, row);
            let dim = match &dims {
                Some(d) if d.is_null(a.at(1, row)) => None,
                Some(d) => Some(Some(d.value(a.at(1, row)))),
                None => Some(None),
            };
            let (Some(dim), false) = (dim, batch.is_null(vr)) else {
                out.append_null();
                continue;
            };
            let (idx, val) = batch.row(vr);
            entries.clear();
            entries.extend(
                idx.iter()
                    .zip(val)
                    .filter(|e| *e.1 != 0.0)
                    .map(|(&i, &v)| (i, v)),
            );
            entries.sort_unstable_by_key(|e| e.0 as u32);
            let top = entries.last().map_or(0, |e| e.0 as u32 as i64 + 1);
            let dim = match dim {
                None => top.max(1),
                Some(d) if d < 1 => {
                    return exec_err!("{} (dimension) must be at least 1, got {d} (row {row})", arg_label(NAME, 1))
                }
                Some(d) if top > d => {
                    return exec_err!(
                        "{}, row {row}: index {} is out of range for dimension {d} (indices are 0-based and must be < {d})",
                        arg_label(NAME, 0),
                        top - 1
                    )
                }
                Some(d) => d,
            };
            text.clear();
            text.push('{');
            for (n, &(i, v)) in entries.iter().enumerate() {
                if n > 0 {
                    text.push(',');
                }
                write!(text, "{}:", i as u32 as i64 + 1).expect("writing to a String");
                write_float(&mut text, v);
            }
            write!(text, "}}/{dim}").expect("writing to a String");
            out.append_value(&text);
        }
        a.output(Arc::new(out.finish()))
    }
}

/// Shortest round-trip decimal; exponent form for very large or small magnitudes so that text
/// stays short (pgvector reads both).
fn write_float(out: &mut String, v: f32) {
    let m = v.abs();
    if m != 0.0 && !(1e-5..1e16).contains(&m) {
        write!(out, "{v:e}").expect("writing to a String");
    } else {
        write!(out, "{v}").expect("writing to a String");
    }
}
