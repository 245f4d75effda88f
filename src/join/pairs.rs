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
    /// Room for `pairs` pairs. A column of several MB asks for huge pages (see
    /// [`advise_huge_pages`]): a radius join writes hundreds of MB of pairs into fresh memory,
    /// and a fault per 4 KiB page cost more than the writing.
    pub fn with_capacity(pairs: usize) -> Self {
        let mut list = PairList {
            left: Vec::with_capacity(pairs),
            right: Vec::with_capacity(pairs),
            distance: Vec::with_capacity(pairs),
        };
        advise_huge_pages(&mut list.left);
        advise_huge_pages(&mut list.right);
        advise_huge_pages(&mut list.distance);
        list
    }

    /// Gives back the capacity past the pairs held (an estimate's excess).
    pub fn shrink_to_fit(&mut self) {
        self.left.shrink_to_fit();
        self.right.shrink_to_fit();
        self.distance.shrink_to_fit();
    }

    pub fn len(&self) -> usize {
        self.left.len()
    }

    /// Pairs the list holds room for without growing.
    pub fn capacity(&self) -> usize {
        self.left
            .capacity()
            .min(self.right.capacity())
            .min(self.distance.capacity())
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

    /// Appends pairs of `left_row`: those pushed through the returned [`RowPairs`] (right rows
    /// and distances); the left column is filled when it is dropped.
    #[inline(always)]
    pub fn row(&mut self, left_row: u32) -> RowPairs<'_> {
        RowPairs {
            list: self,
            left_row,
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

/// Asks the kernel (Linux) to back `v`'s capacity with transparent huge pages where it allows
/// them (`madvise`, the default mode of `/sys/kernel/mm/transparent_hugepage/enabled`): a fault
/// then maps 2 MiB instead of 4 KiB, and on the machines measured a fault per 4 KiB page cost
/// several times the writing itself. Only for capacity of at least 4 MiB. The hint covers the
/// allocation's whole pages, the first and last possibly shared with the allocator's own
/// bookkeeping: for an allocation mapped on its own, that is its whole mapping, which the hint
/// then does not split in parts, so that `realloc` can still grow it in place (`mremap` moves
/// only a range of one kind). It changes no byte, and its failure is ignored.
fn advise_huge_pages<T>(v: &mut Vec<T>) {
    advise_range(
        v.as_mut_ptr() as usize,
        v.capacity() * std::mem::size_of::<T>(),
    );
}

/// [`advise_huge_pages`] for memory about to be written once that is not a `Vec`'s (a dense
/// block of distances in the caller's array): the pages holding `memory`.
pub(crate) fn advise_huge_pages_of<T>(memory: &mut [T]) {
    advise_range(memory.as_mut_ptr() as usize, std::mem::size_of_val(memory));
}

fn advise_range(start: usize, bytes: usize) {
    #[cfg(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    ))]
    {
        const PAGE: usize = 4096;
        /// `MADV_HUGEPAGE` of `<asm-generic/mman-common.h>`.
        const MADV_HUGEPAGE: std::ffi::c_int = 14;
        extern "C" {
            fn madvise(
                addr: *mut std::ffi::c_void,
                len: usize,
                advice: std::ffi::c_int,
            ) -> std::ffi::c_int;
        }
        if bytes < 4 << 20 {
            return;
        }
        let (first, end) = (start / PAGE * PAGE, (start + bytes).next_multiple_of(PAGE));
        // SAFETY: the range is the pages holding a live allocation, all mapped; the advice
        // changes how they are backed, not their contents.
        unsafe {
            madvise(first as *mut std::ffi::c_void, end - first, MADV_HUGEPAGE);
        }
    }
    #[cfg(not(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    )))]
    let _ = (start, bytes);
}

/// One left row's pairs being appended ([`PairList::row`]): right rows and distances are pushed,
/// the left column is filled once, when this is dropped.
#[derive(Debug)]
pub struct RowPairs<'a> {
    list: &'a mut PairList,
    left_row: u32,
}

impl Drop for RowPairs<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        let list = &mut *self.list;
        list.left.resize(list.right.len(), self.left_row);
    }
}

impl RowPairs<'_> {
    /// Appends right row `first + i` at distance `distance[i]` for every i where `keep[i]`, in
    /// that order, without a branch per row: a radius join keeps rows at random, which a branch
    /// mispredicts half the time.
    #[inline(always)]
    pub fn push_kept(&mut self, first: usize, distance: &[f64], keep: &[bool]) {
        let n = keep.len();
        let distance = &distance[..n];
        let list = &mut *self.list;
        let len = list.right.len();
        list.right.reserve(n);
        list.distance.reserve(n);
        let (r, d) = (
            list.right.spare_capacity_mut()[..n].as_mut_ptr(),
            list.distance.spare_capacity_mut()[..n].as_mut_ptr(),
        );
        let mut kept = 0;
        for i in 0..n {
            // Written whether kept or not; the next row overwrites a row not kept.
            // SAFETY: kept <= i < n, within the n spare places of each column.
            unsafe {
                (*r.add(kept)).write((first + i) as u32);
                (*d.add(kept)).write(distance[i]);
            }
            kept += keep[i] as usize;
        }
        // SAFETY: positions len..len + kept were written above (each before `kept` passed it), and
        // the capacity was reserved.
        unsafe {
            list.right.set_len(len + kept);
            list.distance.set_len(len + kept);
        }
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
    fn row_appends_exactly_the_kept_rows() {
        let mut out = list(7, 2);
        let dist: Vec<f64> = (0..1_000).map(|j| j as f64 / 4.0).collect();
        let keep: Vec<bool> = (0..1_000).map(|j| j % 3 == 0 || j == 999).collect();
        let mut row = out.row(9);
        row.push_kept(10, &dist[10..74], &keep[10..74]);
        row.push_kept(74, &dist[74..], &keep[74..]);
        drop(row);
        let mut want = list(7, 2);
        for j in (10..1_000).filter(|j| j % 3 == 0 || *j == 999) {
            want.push(9, j as u32, j as f64 / 4.0);
        }
        assert_eq!(out, want);
        // Nothing kept: nothing appended, whatever was written past the end.
        out.row(10).push_kept(0, &dist[..64], &[false; 64]);
        assert_eq!(out, want);
    }
}
