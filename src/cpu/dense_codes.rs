//! Dense columns of few distinct values, for the certified sum metrics whose pair is costly
//! (jensenshannon's logarithm, minkowski's pow of a p other than 1 to 4): as a coded posting list
//! does (`CpuIndex::coded`), the probe computes a left value's pair with each distinct value of
//! the column once and adds it to each row by a byte code, where the dense pass took a
//! logarithm or a pow per right row. On raw counts (news20's stop words, held by nearly every
//! post with a count of a few dozen values at most) that was most of a jensenshannon join.
//!
//! Only the certified metrics whose pair is costly take it: their folded sums are bounds, so the order in which a
//! row's pairs are added may change (the answers come from the exact step); a folded metric's
//! bits depend on that order. Derived from the index's dense columns, so not part of index files.

use std::collections::HashMap;

use rayon::prelude::*;

use super::index::CpuIndex;
use super::minkowski::minkowski_degree;
use crate::metric::Semiring;

/// Codes of one dense column: 0 for a row without the column, else 1 + the value's place.
const MAX_DISTINCT: usize = 255;

/// The coded dense columns of an index.
#[derive(Debug, Default)]
pub(crate) struct DenseCodes {
    /// Per dense slot: its range of `values`/`lifts` (empty where the column is not coded).
    ranges: Vec<(u32, u32)>,
    values: Vec<f32>,
    /// The lift of each value (the metric's `lift`; minkowski's |v|ᵖ).
    lifts: Vec<f64>,
    /// Per dense slot, one code per right row (all 0 where the column is not coded).
    codes: Vec<u8>,
}

impl DenseCodes {
    /// The codes of `index`'s dense columns, where its metric takes them.
    pub(crate) fn derive<S: Semiring>(s: &S, index: &CpuIndex) -> Self {
        let n = index.rows;
        let prm = s.params();
        let lift = |v: f32| -> f64 {
            if S::LIFTED {
                s.lift(v)
            } else {
                S::total0(v as f64, &prm)
            }
        };
        let fast_pow = minkowski_degree(s).is_some_and(|(_, fast)| fast);
        // A pair that vanishes on zeros is a product (hellinger's −2·√x·√y): its dense pass,
        // four columns at a time, beat a table looked up per row (1.5x on news20).
        let costly = (S::LIFTED && !S::PAIR_VANISHES) || fast_pow;
        if !index.union_sum || !costly || n == 0 || index.dense_vals.is_empty() {
            return DenseCodes::default();
        }
        let columns: Vec<Option<(Vec<f32>, Vec<u8>)>> = index
            .dense_vals
            .par_chunks(n)
            .map(|column| {
                let mut places: HashMap<u32, u8> = HashMap::new();
                let mut values = Vec::new();
                let mut codes = Vec::with_capacity(n);
                for &v in column {
                    if v == 0.0 {
                        codes.push(0);
                        continue;
                    }
                    let code = match places.get(&v.to_bits()) {
                        Some(&code) => code,
                        None => {
                            if values.len() == MAX_DISTINCT {
                                return None;
                            }
                            values.push(v);
                            let code = values.len() as u8;
                            places.insert(v.to_bits(), code);
                            code
                        }
                    };
                    codes.push(code);
                }
                Some((values, codes))
            })
            .collect();
        let mut codes = DenseCodes::default();
        for column in columns {
            let first = codes.values.len() as u32;
            match column {
                Some((values, column_codes)) => {
                    codes.lifts.extend(values.iter().map(|&v| lift(v)));
                    codes.values.extend(values);
                    codes.codes.extend(column_codes);
                }
                None => codes.codes.extend(std::iter::repeat_n(0, n)),
            }
            codes.ranges.push((first, codes.values.len() as u32));
        }
        codes
    }

    /// Dense slot `slot`'s distinct values, their lifts and its codes (`rows` of them), if coded.
    #[inline(always)]
    pub(crate) fn column(&self, slot: u32, rows: usize) -> Option<(&[f32], &[f64], &[u8])> {
        let &(start, end) = self.ranges.get(slot as usize)?;
        let (start, end) = (start as usize, end as usize);
        let codes = &self.codes[slot as usize * rows..(slot as usize + 1) * rows];
        (end > start).then(|| (&self.values[start..end], &self.lifts[start..end], codes))
    }

    /// Bytes held.
    pub(crate) fn memory_size(&self) -> usize {
        self.ranges.len() * 8 + self.values.len() * 4 + self.lifts.len() * 8 + self.codes.len()
    }
}
