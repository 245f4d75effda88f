//! `sparse_parse(text)`: pgvector's sparsevec text form `'{1:0.5,3:2}/5'` to a sparse vector.
//!
//! As in pgvector, indices in the text are 1-based and must lie in `1..=dim`, whitespace around
//! the numbers is allowed, and zero values are dropped. The column is 0-based and has no
//! dimension, so `/dim` only bounds the indices; entries come out sorted by index.

use std::sync::Arc;

use arrow::array::Array;
use arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use super::common::{arg_label, check_arity, coerce_string, Args};
use crate::vector::{sparse_vector_type, SparseBatch};

const NAME: &str = "sparse_parse";

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SparseParseFunc {
    signature: Signature,
}

impl Default for SparseParseFunc {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SparseParseFunc {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity(NAME, "1 argument (text like '{1:0.5,3:2}/5')", types, 1, 1)?;
        Ok(vec![coerce_string(NAME, 0, "text", &types[0])?])
    }

    fn return_type(&self, _types: &[DataType]) -> Result<DataType> {
        Ok(sparse_vector_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let a = Args::new(&args.args, args.number_rows)?;
        let text = a.strings(0)?;
        let mut rows: Vec<Option<Vec<(i32, f32)>>> = Vec::with_capacity(text.len());
        for (row, t) in text.iter().enumerate() {
            rows.push(match t {
                None => None,
                Some(t) => Some(parse_sparsevec(t).map_err(|why| {
                    datafusion::common::DataFusionError::Execution(format!(
                        "{}, row {row}: invalid sparse vector text '{t}': {why}; expected the form '{{1:0.5,3:2}}/5' (1-based index:value pairs, then /dimension)",
                        arg_label(NAME, 0)
                    ))
                })?),
            });
        }
        let batch = SparseBatch::try_from_rows(rows.iter().map(|r| r.as_deref()), NAME)?;
        a.output(Arc::new(batch.try_to_array(NAME)?))
    }
}

/// Parses one sparsevec literal into 0-based, sorted `(index, value)` pairs without zeros; the
/// error says what is wrong (the caller quotes the text).
pub fn parse_sparsevec(text: &str) -> std::result::Result<Vec<(i32, f32)>, String> {
    let t = text.trim();
    let Some(rest) = t.strip_prefix('{') else {
        return Err("it must start with '{'".into());
    };
    let Some(close) = rest.find('}') else {
        return Err("missing '}'".into());
    };
    let (body, tail) = (&rest[..close], &rest[close + 1..]);
    let Some(dim_text) = tail.trim_start().strip_prefix('/') else {
        return Err("missing '/dimension' after '}'".into());
    };
    let dim: i64 = match dim_text.trim().parse() {
        Ok(d) if d >= 1 => d,
        Ok(d) => return Err(format!("dimension {d} must be at least 1")),
        Err(_) => {
            return Err(format!(
                "dimension '{}' is not a whole number",
                dim_text.trim()
            ))
        }
    };
    if dim > i32::MAX as i64 + 1 {
        return Err(format!(
            "dimension {dim} is larger than the largest supported {}",
            i32::MAX as i64 + 1
        ));
    }
    let mut pairs = Vec::new();
    if !body.trim().is_empty() {
        for (n, item) in body.split(',').enumerate() {
            let Some((i, v)) = item.split_once(':') else {
                return Err(format!(
                    "element {} '{}' is not of the form index:value",
                    n + 1,
                    item.trim()
                ));
            };
            let index: i64 = i
                .trim()
                .parse()
                .map_err(|_| format!("index '{}' is not a whole number", i.trim()))?;
            if index < 1 || index > dim {
                return Err(format!(
                    "index {index} is out of range 1..={dim} (indices are 1-based)"
                ));
            }
            let value: f32 = v
                .trim()
                .parse()
                .map_err(|_| format!("value '{}' at index {index} is not a number", v.trim()))?;
            if !value.is_finite() {
                return Err(format!(
                    "value '{}' at index {index} is not finite",
                    v.trim()
                ));
            }
            pairs.push(((index - 1) as i32, value));
        }
    }
    pairs.sort_by_key(|p| p.0);
    if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(format!("index {} appears twice", w[0].0 + 1));
    }
    pairs.retain(|p| p.1 != 0.0);
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::parse_sparsevec;

    #[test]
    fn parses_pgvector_text_to_zero_based_sorted_pairs() {
        assert_eq!(
            parse_sparsevec("{1:0.5,3:2}/5").unwrap(),
            vec![(0, 0.5), (2, 2.0)]
        );
        assert_eq!(
            parse_sparsevec(" {3: 1 , 1:-2.5e1}/3 ").unwrap(),
            vec![(0, -25.0), (2, 1.0)]
        );
        assert_eq!(parse_sparsevec("{2:0}/2").unwrap(), vec![]);
        assert_eq!(parse_sparsevec("{}/1").unwrap(), vec![]);
    }

    #[test]
    fn bad_text_says_what_is_wrong() {
        let err = |t: &str| parse_sparsevec(t).unwrap_err();
        assert!(err("[1,2]").contains("must start with '{'"));
        assert!(err("{1:1/2").contains("missing '}'"));
        assert!(err("{1:1}").contains("missing '/dimension'"));
        assert!(err("{1:1}/0").contains("at least 1"));
        assert!(err("{3:1}/2").contains("index 3 is out of range 1..=2"));
        assert!(err("{1:1,,2:1}/2").contains("element 2"));
        assert!(err("{2:1,2:3}/2").contains("index 2 appears twice"));
        assert!(err("{1:inf}/2").contains("not finite"));
        assert!(err("{1:1}/9999999999").contains("larger than the largest supported"));
    }
}
