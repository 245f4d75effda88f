//! `exclude_self=COLUMN`: pairs whose values of a key column are equal are skipped, for any two
//! inputs. The backends know nothing of it: the right side's keys get group ids when it is built,
//! a left batch's keys are looked up, and each left row asks the backend for k + m neighbours (m:
//! the most right rows that share one key), so that at least k remain once its equal-key pairs are
//! dropped; the order of what remains is the backend's (distance, then right row).

use std::collections::HashMap;

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::DataType;
use arrow::row::{RowConverter, SortField};
use datafusion::common::Result;

use super::pairs::PairList;
use super::selection::Selection;

/// The group of a row whose key is NULL (or, on the left, a key no right row has): equal to
/// nothing.
pub const NO_GROUP: u32 = u32::MAX;

/// The right side's key groups.
#[derive(Debug)]
pub struct KeyGroups {
    converter: RowConverter,
    key_type: DataType,
    groups: HashMap<Box<[u8]>, u32>,
    /// Group of every right row.
    right: Vec<u32>,
    /// The most right rows in one group.
    max_share: usize,
}

impl KeyGroups {
    pub fn build(right_keys: &ArrayRef) -> Result<Self> {
        let converter = RowConverter::new(vec![SortField::new(right_keys.data_type().clone())])?;
        let rows = converter.convert_columns(std::slice::from_ref(right_keys))?;
        let mut groups: HashMap<Box<[u8]>, u32> = HashMap::new();
        let mut sizes: Vec<usize> = Vec::new();
        let right = (0..right_keys.len())
            .map(|i| {
                if right_keys.is_null(i) {
                    return NO_GROUP;
                }
                let next = groups.len() as u32;
                let g = *groups.entry(rows.row(i).as_ref().into()).or_insert(next);
                if g as usize == sizes.len() {
                    sizes.push(0);
                }
                sizes[g as usize] += 1;
                g
            })
            .collect();
        Ok(Self {
            converter,
            key_type: right_keys.data_type().clone(),
            groups,
            right,
            max_share: sizes.into_iter().max().unwrap_or(0),
        })
    }

    /// The group of every row of a left batch's key column (cast to the right side's key type).
    pub fn left_groups(&self, left_keys: &ArrayRef) -> Result<Vec<u32>> {
        let keys = if left_keys.data_type() == &self.key_type {
            left_keys.clone()
        } else {
            arrow::compute::cast(left_keys, &self.key_type)?
        };
        let rows = self
            .converter
            .convert_columns(std::slice::from_ref(&keys))?;
        Ok((0..keys.len())
            .map(|i| {
                if keys.is_null(i) {
                    return NO_GROUP;
                }
                self.groups
                    .get(rows.row(i).as_ref())
                    .copied()
                    .unwrap_or(NO_GROUP)
            })
            .collect())
    }

    /// What to ask the backend for so that `selection` survives the dropped pairs.
    pub fn widen(&self, selection: Selection) -> Selection {
        match selection {
            Selection::Nearest(k) => Selection::Nearest(k.saturating_add(self.max_share)),
            within => within,
        }
    }

    /// Drops the pairs of equal keys, then keeps `selection`'s k per left row.
    pub fn filter(&self, pairs: PairList, left_groups: &[u32], selection: Selection) -> PairList {
        let k = match selection {
            Selection::Nearest(k) => k,
            Selection::Within(_) => usize::MAX,
        };
        let mut out = PairList::default();
        let mut kept_for_row = 0usize;
        for i in 0..pairs.len() {
            let (l, r) = (pairs.left[i], pairs.right[i]);
            if i == 0 || pairs.left[i - 1] != l {
                kept_for_row = 0;
            }
            let g = left_groups[l as usize];
            if g != NO_GROUP && self.right[r as usize] == g {
                continue;
            }
            if kept_for_row < k {
                out.push(l, r, pairs.distance[i]);
                kept_for_row += 1;
            }
        }
        out
    }

    /// The group of every right row ([`NO_GROUP`] for a NULL key).
    pub(super) fn right_groups(&self) -> &[u32] {
        &self.right
    }

    /// Distinct non-NULL keys of the right side.
    pub(super) fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Bytes held (for the session's memory pool).
    pub fn memory_size(&self) -> usize {
        self.right.len() * 4 + self.groups.keys().map(|k| k.len() + 32).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};

    use super::*;

    #[test]
    fn equal_keys_are_dropped_and_k_kept() {
        // Right keys: a, b, a, NULL, c (group a shared by 2 rows).
        let right: ArrayRef = Arc::new(StringArray::from(vec![
            Some("a"),
            Some("b"),
            Some("a"),
            None,
            Some("c"),
        ]));
        let groups = KeyGroups::build(&right).unwrap();
        assert_eq!(groups.widen(Selection::Nearest(2)), Selection::Nearest(4));
        let left: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None, Some("z")]));
        let lg = groups.left_groups(&left).unwrap();
        let mut pairs = PairList::default();
        for (l, r) in [
            (0, 0),
            (0, 2),
            (0, 1),
            (0, 3),
            (1, 3),
            (1, 0),
            (1, 4),
            (2, 4),
            (2, 1),
        ] {
            pairs.push(l, r, 1.0);
        }
        let out = groups.filter(pairs, &lg, Selection::Nearest(2));
        let got: Vec<(u32, u32)> = out
            .left
            .iter()
            .copied()
            .zip(out.right.iter().copied())
            .collect();
        // Left "a" loses right rows 0 and 2; a NULL key (left or right) equals nothing.
        assert_eq!(got, vec![(0, 1), (0, 3), (1, 3), (1, 0), (2, 4), (2, 1)]);
    }

    #[test]
    fn left_keys_are_cast_to_the_right_type() {
        let right: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
        let groups = KeyGroups::build(&right).unwrap();
        let left: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![3, 4]));
        let lg = groups.left_groups(&left).unwrap();
        assert_eq!(lg[0], groups.right[2]);
        assert_eq!(lg[1], NO_GROUP);
    }
}
