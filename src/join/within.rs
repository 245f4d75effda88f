//! `within=COLUMN`: each left row's neighbours come from the right rows of its own group (the
//! right rows whose COLUMN equals its own: a tenant, a category, a cell type). A group is a row
//! mask over the one kept index, so no group has an index of its own: the left rows of a batch
//! are probed group by group, each with the mask of its group's rows (and of the right side's
//! filter, where there is one), which every backend answers exactly
//! ([`JoinIndex::probe_masked`]). A NULL key, or one no right row has, matches nothing.

use arrow::array::ArrayRef;
use datafusion::common::Result;
use rayon::prelude::*;

use super::backend::{JoinIndex, Probed};
use super::cancel::Cancel;
use super::exclusion::KeyGroups;
pub use super::exclusion::NO_GROUP;
use super::mask::RowMask;
use super::pairs::PairList;
use super::selection::{ProbeOptions, Selection};
use crate::vector::SparseBatch;

/// The right side's groups and the rows of each, in row order.
#[derive(Debug)]
pub struct GroupMembers {
    keys: KeyGroups,
    /// Group g's rows are `rows[offsets[g]..offsets[g + 1]]`.
    offsets: Vec<usize>,
    rows: Vec<u32>,
}

impl GroupMembers {
    /// The groups of the right side's key column (all its rows, in order).
    pub fn build(right_keys: &ArrayRef) -> Result<Self> {
        let keys = KeyGroups::build(right_keys)?;
        let mut offsets = vec![0usize; keys.group_count() + 1];
        for &g in keys.right_groups() {
            if g != NO_GROUP {
                offsets[g as usize + 1] += 1;
            }
        }
        for g in 0..keys.group_count() {
            offsets[g + 1] += offsets[g];
        }
        let mut next = offsets.clone();
        let mut rows = vec![0u32; offsets[keys.group_count()]];
        for (row, &g) in keys.right_groups().iter().enumerate() {
            if g != NO_GROUP {
                rows[next[g as usize]] = row as u32;
                next[g as usize] += 1;
            }
        }
        Ok(Self {
            keys,
            offsets,
            rows,
        })
    }

    /// The group of every right row ([`NO_GROUP`] for a NULL key).
    pub fn right_groups(&self) -> &[u32] {
        self.keys.right_groups()
    }

    /// Right rows (NULL keys included).
    pub fn right_rows(&self) -> usize {
        self.keys.right_groups().len()
    }

    /// The right rows of group `g`, in row order.
    fn members(&self, g: u32) -> &[u32] {
        &self.rows[self.offsets[g as usize]..self.offsets[g as usize + 1]]
    }

    /// The group of each row of a left batch's key column (cast to the right side's key type);
    /// [`NO_GROUP`] where it matches no right row.
    pub fn left_groups(&self, left_keys: &ArrayRef) -> Result<Vec<u32>> {
        self.keys.left_groups(left_keys)
    }

    /// Bytes held (for the session's memory pool).
    pub fn memory_size(&self) -> usize {
        self.keys.memory_size() + self.offsets.len() * 8 + self.rows.len() * 4
    }
}

/// A grouped probe's groups: the left rows' (from [`GroupMembers::left_groups`]), the right
/// side's, and the right-side filter's rows where there is one. The probed index holds rows
/// `first_row..first_row + rows` of `members` (all of them, or a shard's), and `filter` covers
/// the index's rows.
#[derive(Debug, Clone, Copy)]
pub struct GroupedProbe<'a> {
    pub left: &'a [u32],
    pub members: &'a GroupMembers,
    pub filter: Option<&'a RowMask>,
    pub first_row: usize,
    pub rows: usize,
}

impl<'a> GroupedProbe<'a> {
    /// The groups of an index of every row of `members`.
    pub fn new(left: &'a [u32], members: &'a GroupMembers, filter: Option<&'a RowMask>) -> Self {
        GroupedProbe {
            left,
            members,
            filter,
            first_row: 0,
            rows: members.right_rows(),
        }
    }

    /// The same groups for an index of rows `first..first + rows` of this one's, whose filter is
    /// `filter` (a shard of the right side).
    pub fn shard(&self, first: usize, rows: usize, filter: Option<&'a RowMask>) -> Self {
        GroupedProbe {
            filter,
            first_row: self.first_row + first,
            rows,
            ..*self
        }
    }

    /// The group of each of the index's rows.
    pub fn right_groups(&self) -> &'a [u32] {
        &self.members.right_groups()[self.first_row..self.first_row + self.rows]
    }

    /// The index's rows of group `g` (numbered from its first), in row order.
    fn members_of(&self, g: u32) -> impl Iterator<Item = u32> + 'a {
        let all = self.members.members(g);
        let (first, end) = (self.first_row as u32, (self.first_row + self.rows) as u32);
        let from = all.partition_point(|&r| r < first);
        let to = all.partition_point(|&r| r < end);
        all[from..to].iter().map(move |&r| r - first)
    }
}

/// The pairs of `left` with the right rows of their own group that the filter passes, by any
/// index ([`JoinIndex::probe_grouped`]'s default): per group of the batch, one masked probe of
/// its left rows, groups side by side. The pairs come in left row order, then rank, like any
/// probe's.
pub fn probe_within_groups<I: JoinIndex + ?Sized>(
    index: &I,
    left: &SparseBatch,
    groups: GroupedProbe<'_>,
    selection: Selection,
    options: ProbeOptions,
    cancel: &Cancel,
) -> Result<Probed> {
    let (left_groups, filter) = (groups.left, groups.filter);
    let n = groups.rows;
    // Left rows by group, in row order within each; groups in order of first appearance.
    let mut order: Vec<u32> = Vec::new();
    let mut by_group: std::collections::HashMap<u32, Vec<usize>> = Default::default();
    for (row, &g) in left_groups.iter().enumerate() {
        if g == NO_GROUP || left.is_null(row) {
            continue;
        }
        by_group
            .entry(g)
            .or_insert_with(|| {
                order.push(g);
                Vec::new()
            })
            .push(row);
    }
    // Own rows (exclude_self=true) are positions in the whole batch, which a gathered batch
    // loses: one more neighbour is asked for, and the own pair dropped here.
    let widened = match (selection, options.exclude_self_from) {
        (Selection::Nearest(k), Some(_)) => Selection::Nearest(k.saturating_add(1)),
        _ => selection,
    };
    let keep = match selection {
        Selection::Nearest(k) => k,
        Selection::Within(_) => usize::MAX,
    };
    // Groups side by side: a group's probe is a few left rows, whose fixed costs (the mask, the
    // backend's per-probe set-up) would otherwise run one group at a time.
    let per_group: Vec<Result<Option<Probed>>> = order
        .par_iter()
        .map(|g| {
            cancel.check()?;
            let rows = &by_group[g];
            let passing: Vec<u32> = match filter {
                Some(mask) => groups
                    .members_of(*g)
                    .filter(|&r| mask.allows(r as usize))
                    .collect(),
                None => groups.members_of(*g).collect(),
            };
            if passing.is_empty() {
                return Ok(None);
            }
            let mask = RowMask::from_rows(n, &passing);
            let batch = left.gather(rows);
            index
                .probe_masked(&batch, widened, ProbeOptions::default(), &mask, cancel)
                .map(Some)
        })
        .collect();
    let mut probed = Probed::default();
    let mut answers: Vec<Vec<(u32, f64)>> = vec![Vec::new(); left.len()];
    for (g, group) in order.iter().zip(per_group) {
        let Some(group) = group? else { continue };
        let rows = &by_group[g];
        for part in probed.absorb(group) {
            for i in 0..part.len() {
                let row = rows[part.left[i] as usize];
                let own = options.excluded_right_row(row, n);
                if own == Some(part.right[i] as usize) {
                    continue;
                }
                let answer = &mut answers[row];
                if answer.len() < keep {
                    answer.push((part.right[i], part.distance[i]));
                }
            }
        }
    }
    let mut pairs = PairList::with_capacity(answers.iter().map(Vec::len).sum());
    for (row, answer) in answers.into_iter().enumerate() {
        for (right, distance) in answer {
            pairs.push(row as u32, right, distance);
        }
    }
    probed.parts = vec![pairs];
    Ok(probed)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};

    use super::*;
    use crate::join::pairs::PairList;

    /// An index whose distance from left row l to right row r is |value(l) - r| (each left
    /// row's one entry's value): enough to check which rows a group offers and in what order.
    struct LineIndex {
        rows: usize,
    }

    impl JoinIndex for LineIndex {
        fn probe_cancellable(
            &self,
            left: &SparseBatch,
            selection: Selection,
            options: ProbeOptions,
            _cancel: &Cancel,
        ) -> Result<Probed> {
            let mut pairs = PairList::default();
            for l in 0..left.len() {
                let at = left.row(l).1.first().copied().unwrap_or(0.0) as f64;
                let mut all: Vec<(f64, u32)> = (0..self.rows as u32)
                    .filter(|&r| options.excluded_right_row(l, self.rows) != Some(r as usize))
                    .map(|r| ((at - r as f64).abs(), r))
                    .collect();
                all.sort_by(|a, b| a.partial_cmp(b).unwrap());
                let all: Vec<_> = match selection {
                    Selection::Nearest(k) => all.into_iter().take(k).collect(),
                    Selection::Within(radius) => {
                        all.into_iter().filter(|&(d, _)| d <= radius).collect()
                    }
                };
                for (d, r) in all {
                    pairs.push(l as u32, r, d);
                }
            }
            Ok(Probed {
                parts: vec![pairs],
                ..Default::default()
            })
        }

        fn memory_size(&self) -> usize {
            0
        }
    }

    fn grouped<'a>(
        left: &'a [u32],
        members: &'a GroupMembers,
        filter: Option<&'a RowMask>,
    ) -> GroupedProbe<'a> {
        GroupedProbe::new(left, members, filter)
    }

    fn at(points: &[Option<f32>]) -> SparseBatch {
        let rows: Vec<Option<Vec<(i32, f32)>>> =
            points.iter().map(|p| p.map(|v| vec![(0, v)])).collect();
        SparseBatch::from_rows(rows.iter().map(|r| r.as_deref()))
    }

    fn answer(probed: Probed) -> Vec<(u32, u32)> {
        let pairs = probed.into_pairs();
        (0..pairs.len())
            .map(|i| (pairs.left[i], pairs.right[i]))
            .collect()
    }

    #[test]
    fn each_left_row_gets_its_groups_nearest_in_row_order() {
        // Right rows 0..8 in groups a b a b a NULL a b.
        let right: ArrayRef = Arc::new(StringArray::from(vec![
            Some("a"),
            Some("b"),
            Some("a"),
            Some("b"),
            Some("a"),
            None,
            Some("a"),
            Some("b"),
        ]));
        let members = GroupMembers::build(&right).unwrap();
        let index = LineIndex { rows: 8 };
        // Left rows: near 5 in group b, near 5 in a, a NULL key, an unknown key, a NULL vector.
        let left_keys: ArrayRef = Arc::new(StringArray::from(vec![
            Some("b"),
            Some("a"),
            None,
            Some("z"),
            Some("a"),
        ]));
        let groups = members.left_groups(&left_keys).unwrap();
        let left = at(&[Some(5.0), Some(5.0), Some(5.0), Some(5.0), None]);
        let got = probe_within_groups(
            &index,
            &left,
            grouped(&groups, &members, None),
            Selection::Nearest(2),
            ProbeOptions::default(),
            &Cancel::new(),
        )
        .unwrap();
        // Group b = {1, 3, 7}: 3 (d 2) then 7 (d 2, the later row); group a = {0, 2, 4, 6}:
        // 4 and 6 (d 1).
        assert_eq!(answer(got), vec![(0, 3), (0, 7), (1, 4), (1, 6)]);

        // With a filter that drops row 4, and k above the group's size.
        let filter = RowMask::new(vec![true, true, true, true, false, true, true, true]);
        let got = probe_within_groups(
            &index,
            &left,
            grouped(&groups, &members, Some(&filter)),
            Selection::Nearest(10),
            ProbeOptions::default(),
            &Cancel::new(),
        )
        .unwrap();
        assert_eq!(
            answer(got),
            vec![(0, 3), (0, 7), (0, 1), (1, 6), (1, 2), (1, 0)]
        );
    }

    #[test]
    fn own_rows_are_left_out_and_k_kept() {
        // A self-join: left row i is right row i; groups by parity.
        let keys: ArrayRef = Arc::new(Int64Array::from(vec![0, 1, 0, 1, 0, 1]));
        let members = GroupMembers::build(&keys).unwrap();
        let groups = members.left_groups(&keys).unwrap();
        let left = at(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0].map(Some));
        let got = probe_within_groups(
            &LineIndex { rows: 6 },
            &left,
            grouped(&groups, &members, None),
            Selection::Nearest(1),
            ProbeOptions {
                exclude_self_from: Some(0),
            },
            &Cancel::new(),
        )
        .unwrap();
        assert_eq!(
            answer(got),
            vec![(0, 2), (1, 3), (2, 0), (3, 1), (4, 2), (5, 3)]
        );
        // Within a radius of 2: the other rows of the group at most 2 away.
        let got = probe_within_groups(
            &LineIndex { rows: 6 },
            &left,
            grouped(&groups, &members, None),
            Selection::Within(2.0),
            ProbeOptions {
                exclude_self_from: Some(0),
            },
            &Cancel::new(),
        )
        .unwrap();
        assert_eq!(
            answer(got),
            vec![
                (0, 2),
                (1, 3),
                (2, 0),
                (2, 4),
                (3, 1),
                (3, 5),
                (4, 2),
                (5, 3)
            ]
        );
    }
}
