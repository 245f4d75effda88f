//! The result of probing one left batch.

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
