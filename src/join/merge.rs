//! Merging partial results: the top-k lists of several parts of the right side (GPU parts, GPUs,
//! shards), and radius pairs found out of order.

use rayon::prelude::*;

use super::pairs::PairList;

/// Merges top-k lists that each cover some right rows (each ordered by left row, then rank) into
/// one, keeping the k nearest per left row, ties to the smaller right row.
pub fn merge_nearest(mut parts: Vec<PairList>, k: usize, similarity: bool) -> PairList {
    if parts.len() == 1 {
        return parts.pop().unwrap_or_default();
    }
    let mut cursors = vec![0usize; parts.len()];
    let mut out = PairList::default();
    let mut row_pairs: Vec<(f64, u32)> = Vec::new();
    loop {
        // The smallest left row any part still has.
        let next = parts
            .iter()
            .zip(&cursors)
            .filter_map(|(p, &c)| p.left.get(c).copied())
            .min();
        let Some(lrow) = next else { break };
        row_pairs.clear();
        for (p, c) in parts.iter().zip(cursors.iter_mut()) {
            while *c < p.len() && p.left[*c] == lrow {
                let d = p.distance[*c];
                row_pairs.push((if similarity { -d } else { d }, p.right[*c]));
                *c += 1;
            }
        }
        row_pairs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for &(key, r) in row_pairs.iter().take(k) {
            out.push(lrow, r, if similarity { -key } else { key });
        }
    }
    out
}

/// Radius pairs of all parts and chunks, ordered by left row then right row. Left rows are the
/// rows of one batch (a small range): the pairs are bucketed by left row in linear time, then
/// each row's pairs sorted by right row in parallel. A certified metric's candidates run to
/// millions per batch, where one global sort of 64-bit keys took longer than the kernels.
pub fn merge_within(parts: Vec<PairList>) -> PairList {
    let total: usize = parts.iter().map(PairList::len).sum();
    let rows = parts
        .iter()
        .flat_map(|p| p.left.iter().copied().max())
        .max()
        .map_or(0, |m| m as usize + 1);
    let mut starts = vec![0usize; rows + 1];
    for p in &parts {
        for &l in &p.left {
            starts[l as usize + 1] += 1;
        }
    }
    for r in 0..rows {
        starts[r + 1] += starts[r];
    }
    let mut fill = starts.clone();
    let mut bucketed = vec![(0u32, 0f64); total];
    for p in &parts {
        for ((&l, &r), &d) in p.left.iter().zip(&p.right).zip(&p.distance) {
            let at = &mut fill[l as usize];
            bucketed[*at] = (r, d);
            *at += 1;
        }
    }
    drop(parts);
    // Disjoint slices, one per left row, sorted by right row (a right row appears once per left
    // row: the parts cover disjoint right rows).
    let mut groups: Vec<&mut [(u32, f64)]> = Vec::with_capacity(rows);
    let mut rest = &mut bucketed[..];
    for r in 0..rows {
        let (group, tail) = rest.split_at_mut(starts[r + 1] - starts[r]);
        groups.push(group);
        rest = tail;
    }
    groups
        .par_iter_mut()
        .for_each(|g| g.sort_unstable_by_key(|e| e.0));
    let mut out = PairList::with_capacity(total);
    for r in 0..rows {
        for &(right, d) in &bucketed[starts[r]..starts[r + 1]] {
            out.push(r as u32, right, d);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(pairs: &[(u32, u32, f64)]) -> PairList {
        let mut l = PairList::default();
        for &(a, b, d) in pairs {
            l.push(a, b, d);
        }
        l
    }

    #[test]
    fn nearest_keeps_k_per_left_row_with_ties_to_the_smaller_right_row() {
        let a = list(&[(0, 5, 1.0), (0, 6, 2.0), (2, 7, 0.5)]);
        let b = list(&[(0, 1, 1.0), (1, 2, 3.0), (2, 3, 0.7)]);
        let m = merge_nearest(vec![a, b], 2, false);
        assert_eq!(
            m,
            list(&[
                (0, 1, 1.0),
                (0, 5, 1.0),
                (1, 2, 3.0),
                (2, 7, 0.5),
                (2, 3, 0.7)
            ])
        );
        // A similarity keeps the largest.
        let a = list(&[(0, 5, 1.0)]);
        let b = list(&[(0, 1, 4.0)]);
        assert_eq!(merge_nearest(vec![a, b], 1, true), list(&[(0, 1, 4.0)]));
    }

    #[test]
    fn within_orders_by_left_then_right_row() {
        let a = list(&[(1, 9, 0.1), (0, 4, 0.2)]);
        let b = list(&[(0, 2, 0.3)]);
        assert_eq!(
            merge_within(vec![a, b]),
            list(&[(0, 2, 0.3), (0, 4, 0.2), (1, 9, 0.1)])
        );
    }
}
