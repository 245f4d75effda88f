//! A bounded top-k over (key, right row), smaller key nearer, ties to the smaller row.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Debug, Clone, Copy)]
struct Entry {
    key: f64,
    row: u32,
    /// The caller's selection key of this row (not part of the order), see [`TopK::push_filtered`].
    filter: f64,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key
            .total_cmp(&other.key)
            .then(self.row.cmp(&other.row))
    }
}

#[derive(Debug, Default)]
pub struct TopK {
    k: usize,
    heap: BinaryHeap<Entry>,
    /// Key of the current k-th entry, once the heap is full (the admission threshold).
    worst: f64,
    /// The k-th entry's filter value, once the heap is full.
    worst_filter: f64,
}

impl TopK {
    pub fn reset(&mut self, k: usize) {
        self.k = k;
        self.heap.clear();
        self.worst = f64::INFINITY;
        self.worst_filter = f64::INFINITY;
    }

    /// True once k entries are kept, from when on only keys below the k-th get in.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.heap.len() >= self.k
    }

    /// The filter value of the k-th entry of a full top-k (infinity before): with a filter that
    /// never decreases as the key grows, only a row whose filter is below it can get in.
    #[inline]
    pub fn filter_bound(&self) -> f64 {
        self.worst_filter
    }

    /// Rows must be offered in increasing order, so an equal key never displaces an earlier row.
    #[inline]
    pub fn push(&mut self, key: f64, row: u32) {
        self.push_filtered(key, row, key);
    }

    /// [`TopK::push`], remembering `filter`, a cheaper value of the row that orders rows as the key
    /// does (the key a non-decreasing function of it), for [`TopK::filter_bound`].
    #[inline]
    pub fn push_filtered(&mut self, key: f64, row: u32, filter: f64) {
        if self.k == 0 {
            return;
        }
        if self.heap.len() < self.k {
            self.heap.push(Entry { key, row, filter });
        } else if key < self.worst {
            self.heap.pop();
            self.heap.push(Entry { key, row, filter });
        } else {
            return;
        }
        if self.heap.len() == self.k {
            let worst = self.heap.peek().expect("a full heap");
            (self.worst, self.worst_filter) = (worst.key, worst.filter);
        }
    }

    /// The key below which [`TopK::push`] keeps an entry once full (infinity before).
    #[inline]
    pub fn threshold(&self) -> f64 {
        self.worst
    }

    /// The kept entries, nearest first.
    pub fn drain_sorted(&mut self) -> impl Iterator<Item = (f64, u32)> {
        let sorted = std::mem::take(&mut self.heap).into_sorted_vec();
        sorted.into_iter().map(|e| (e.key, e.row))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_k_smallest_with_ties_to_the_earlier_row() {
        let mut t = TopK::default();
        t.reset(3);
        for (row, key) in [5.0, 1.0, 3.0, 1.0, 0.5, 3.0, 9.0].iter().enumerate() {
            t.push(*key, row as u32);
        }
        let got: Vec<_> = t.drain_sorted().collect();
        assert_eq!(got, vec![(0.5, 4), (1.0, 1), (1.0, 3)]);
    }

    #[test]
    fn k_larger_than_input_keeps_everything() {
        let mut t = TopK::default();
        t.reset(10);
        t.push(2.0, 0);
        t.push(f64::INFINITY, 1);
        t.push(1.0, 2);
        let got: Vec<_> = t.drain_sorted().collect();
        assert_eq!(got, vec![(1.0, 2), (2.0, 0), (f64::INFINITY, 1)]);
    }
}
