//! `sparse_char_ngrams(text, n [, d])`: hashed character n-gram counts, so that fuzzy string
//! matching (the paper's SEC EDGAR names) is a cosine kNN join in SQL alone.
//!
//! Choices, fixed because stored vectors must stay comparable across versions:
//! - n-grams are over Unicode scalar values (chars), not bytes, with no padding and no case
//!   folding (call `lower()` first for case-insensitive matching);
//! - a non-empty text shorter than `n` chars is one n-gram (the whole text), so short names are
//!   not the zero vector; the empty text is the zero vector;
//! - the index of an n-gram is the 64-bit FNV-1a hash of its UTF-8 bytes modulo `d` (default
//!   2^20); collisions add up; the value is the count, as Float32.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::Array;
use arrow::datatypes::DataType;
use datafusion::common::{exec_err, Result};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

use super::common::{arg_label, check_arity, coerce_integer, coerce_string, Args};
use crate::vector::{sparse_vector_type, SparseBatch};

const NAME: &str = "sparse_char_ngrams";

/// Default number of hash buckets.
pub const DEFAULT_DIM: i64 = 1 << 20;

/// Indices are Int32, so at most 2^31 buckets.
const MAX_DIM: i64 = 1 << 31;

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SparseCharNgramsFunc {
    signature: Signature,
}

impl Default for SparseCharNgramsFunc {
    fn default() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

/// 64-bit FNV-1a.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The hashed n-gram counts of `text`, sorted by index.
pub fn char_ngrams(text: &str, n: usize, dim: u64) -> Vec<(i32, f32)> {
    let bounds: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain([text.len()])
        .collect();
    let chars = bounds.len() - 1;
    let mut counts: HashMap<i32, f32> = HashMap::new();
    let mut add = |gram: &str| {
        *counts
            .entry((fnv1a(gram.as_bytes()) % dim) as i32)
            .or_insert(0.0) += 1.0
    };
    if chars == 0 {
        // The empty text: no n-grams.
    } else if chars < n {
        add(text);
    } else {
        for s in 0..=chars - n {
            add(&text[bounds[s]..bounds[s + n]]);
        }
    }
    let mut out: Vec<(i32, f32)> = counts.into_iter().collect();
    out.sort_unstable_by_key(|e| e.0);
    out
}

impl ScalarUDFImpl for SparseCharNgramsFunc {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, types: &[DataType]) -> Result<Vec<DataType>> {
        check_arity(
            NAME,
            "2 or 3 arguments (text, n [, dimension])",
            types,
            2,
            3,
        )?;
        let mut out = vec![
            coerce_string(NAME, 0, "text", &types[0])?,
            coerce_integer(NAME, 1, "n", &types[1])?,
        ];
        if types.len() == 3 {
            out.push(coerce_integer(NAME, 2, "dimension", &types[2])?);
        }
        Ok(out)
    }

    fn return_type(&self, _types: &[DataType]) -> Result<DataType> {
        Ok(sparse_vector_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n_args = args.args.len();
        let a = Args::new(&args.args, args.number_rows)?;
        let text = a.strings(0)?;
        let ns = a.integers(1)?;
        let dims = if n_args == 3 {
            Some(a.integers(2)?)
        } else {
            None
        };
        let mut rows: Vec<Option<Vec<(i32, f32)>>> = Vec::with_capacity(a.rows());
        for row in 0..a.rows() {
            let (tr, nr) = (a.at(0, row), a.at(1, row));
            let dim = match &dims {
                None => Some(DEFAULT_DIM),
                Some(d) => d.is_valid(a.at(2, row)).then(|| d.value(a.at(2, row))),
            };
            let (true, true, Some(dim)) = (text.is_valid(tr), ns.is_valid(nr), dim) else {
                rows.push(None);
                continue;
            };
            let n = ns.value(nr);
            if n < 1 {
                return exec_err!("{} (n) must be at least 1, got {n}", arg_label(NAME, 1));
            }
            if !(1..=MAX_DIM).contains(&dim) {
                return exec_err!(
                    "{} (dimension) must be between 1 and {MAX_DIM} (2^31), got {dim}",
                    arg_label(NAME, 2)
                );
            }
            rows.push(Some(char_ngrams(text.value(tr), n as usize, dim as u64)));
        }
        let out = SparseBatch::try_from_rows(rows.iter().map(|r| r.as_deref()), NAME)?;
        a.output(Arc::new(out.try_to_array(NAME)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        // From the FNV reference test suite (draft-eastlake-fnv).
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn ngrams_count_repeats_and_respect_chars() {
        let v = char_ngrams("abab", 2, 1 << 20);
        // "ab" twice and "ba" once.
        let mut vals: Vec<f32> = v.iter().map(|e| e.1).collect();
        vals.sort_by(f32::total_cmp);
        assert_eq!(vals, vec![1.0, 2.0]);
        // Multi-byte chars: 3 chars give 2 bigrams, not 5 byte pairs.
        assert_eq!(
            char_ngrams("äöü", 2, 1 << 20)
                .iter()
                .map(|e| e.1)
                .sum::<f32>(),
            2.0
        );
        assert_eq!(char_ngrams("ab", 3, 1 << 20).len(), 1);
        assert!(char_ngrams("", 3, 1 << 20).is_empty());
        assert!(char_ngrams("some text", 3, 7)
            .iter()
            .all(|e| (0..7).contains(&e.0)));
    }
}
