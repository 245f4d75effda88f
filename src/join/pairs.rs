//! The result of probing one left batch.

use rayon::prelude::*;

/// Pairs below which [`PairList::concat`] copies on one thread: spreading a small copy costs more
/// than it saves.
const PARALLEL_CONCAT_PAIRS: usize = 1 << 16;

/// Pairs produced for one left batch, ordered by left row, then by rank (knn) or right row (radius).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PairList {
    /// Row of the left batch (0-based within the batch).
    pub left: Vec<u32>,
    /// Row of the build side (0-based over all right rows).
    pub right: Vec<u32>,
    pub distance: Vec<f64>,
}

impl PairList {
    pub fn with_capacity(pairs: usize) -> Self {
        PairList {
            left: Vec::with_capacity(pairs),
            right: Vec::with_capacity(pairs),
            distance: Vec::with_capacity(pairs),
        }
    }

    pub fn len(&self) -> usize {
        self.left.len()
    }

    pub fn is_empty(&self) -> bool {
        self.left.is_empty()
    }

    pub fn push(&mut self, left: u32, right: u32, distance: f64) {
        self.left.push(left);
        self.right.push(right);
        self.distance.push(distance);
    }

    /// 1-based rank of each pair within its left row (for knn results).
    pub fn ranks(&self) -> Vec<i32> {
        let mut ranks = Vec::with_capacity(self.len());
        for i in 0..self.len() {
            let r = if i > 0 && self.left[i - 1] == self.left[i] {
                ranks[i - 1] + 1
            } else {
                1
            };
            ranks.push(r);
        }
        ranks
    }

    /// The lists one after the other (their left rows in that order), in one allocation per
    /// column. A radius join's pairs run to hundreds of MB: they are copied by all cores into
    /// zeroed memory (fresh pages the kernel hands out as the copy first touches them), since
    /// on one core the copy and its page faults took a third of a dense radius join.
    pub fn concat(mut parts: Vec<PairList>) -> PairList {
        if parts.len() == 1 {
            return parts.pop().expect("one list");
        }
        let total: usize = parts.iter().map(PairList::len).sum();
        if total < PARALLEL_CONCAT_PAIRS {
            // Copied into the one allocation (`append` would take the first list whole and
            // grow it by doubling instead).
            let mut out = PairList::with_capacity(total);
            for p in &parts {
                out.left.extend_from_slice(&p.left);
                out.right.extend_from_slice(&p.right);
                out.distance.extend_from_slice(&p.distance);
            }
            return out;
        }
        let mut out = PairList {
            left: vec![0; total],
            right: vec![0; total],
            distance: vec![0.0; total],
        };
        let mut places = Vec::with_capacity(parts.len());
        let (mut left, mut right, mut distance) =
            (&mut out.left[..], &mut out.right[..], &mut out.distance[..]);
        for p in &parts {
            let n = p.len();
            let (l, rest_l) = std::mem::take(&mut left).split_at_mut(n);
            let (r, rest_r) = std::mem::take(&mut right).split_at_mut(n);
            let (d, rest_d) = std::mem::take(&mut distance).split_at_mut(n);
            (left, right, distance) = (rest_l, rest_r, rest_d);
            places.push((l, r, d));
        }
        places
            .into_par_iter()
            .zip(parts.par_iter())
            .for_each(|((l, r, d), p)| {
                l.copy_from_slice(&p.left);
                r.copy_from_slice(&p.right);
                d.copy_from_slice(&p.distance);
            });
        out
    }

    /// Appends pairs of `left_row` with the right rows of `rows`, without a branch per row: a
    /// radius join keeps rows at random, which a branch mispredicts half the time. `pair(j)`
    /// gives right row j's distance and whether to keep it.
    #[inline(always)]
    pub fn append_kept(
        &mut self,
        left_row: u32,
        rows: std::ops::Range<usize>,
        mut pair: impl FnMut(usize) -> (bool, f64),
    ) {
        let n = rows.len();
        let len = self.len();
        self.left.reserve(n);
        self.right.reserve(n);
        self.distance.reserve(n);
        let (l, r, d) = (
            &mut self.left.spare_capacity_mut()[..n],
            &mut self.right.spare_capacity_mut()[..n],
            &mut self.distance.spare_capacity_mut()[..n],
        );
        let mut kept = 0;
        for j in rows {
            let (keep, distance) = pair(j);
            // Written whether kept or not; the next row overwrites a row not kept.
            l[kept].write(left_row);
            r[kept].write(j as u32);
            d[kept].write(distance);
            kept += keep as usize;
        }
        // SAFETY: positions len..len + kept were written above (each before `kept` passed it), and
        // the capacity was reserved.
        unsafe {
            self.left.set_len(len + kept);
            self.right.set_len(len + kept);
            self.distance.set_len(len + kept);
        }
    }

    /// Appends `other`, whose left rows all come after this list's.
    pub fn append(&mut self, mut other: PairList) {
        if self.left.is_empty() && self.distance.is_empty() {
            // Taken whole: lists of millions of pairs are not copied.
            *self = other;
            return;
        }
        self.left.append(&mut other.left);
        self.right.append(&mut other.right);
        self.distance.append(&mut other.distance);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(left: u32, pairs: usize) -> PairList {
        let mut out = PairList::default();
        for j in 0..pairs {
            out.push(left, j as u32 * 3, j as f64 * 0.5 + left as f64);
        }
        out
    }

    #[test]
    fn concat_keeps_every_pair_in_order_on_one_thread_or_many() {
        for sizes in [vec![3, 0, 5], vec![40_000, 0, 70_000, 1, 25_000]] {
            let parts: Vec<PairList> = sizes
                .iter()
                .enumerate()
                .map(|(l, &n)| list(l as u32, n))
                .collect();
            let mut want = PairList::default();
            for p in parts.clone() {
                want.left.extend(p.left);
                want.right.extend(p.right);
                want.distance.extend(p.distance);
            }
            assert_eq!(PairList::concat(parts), want, "sizes {sizes:?}");
        }
    }

    #[test]
    fn append_kept_appends_exactly_the_kept_rows() {
        let mut out = list(7, 2);
        out.append_kept(9, 10..1_000, |j| (j % 3 == 0 || j == 999, j as f64 / 4.0));
        let mut want = list(7, 2);
        for j in (10..1_000).filter(|j| j % 3 == 0 || *j == 999) {
            want.push(9, j as u32, j as f64 / 4.0);
        }
        assert_eq!(out, want);
        // Nothing kept: nothing appended, whatever was written past the end.
        out.append_kept(10, 0..64, |_| (false, 1.0));
        assert_eq!(out, want);
    }
}
