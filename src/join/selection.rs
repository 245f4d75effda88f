//! What a probe is asked for.

/// What to keep of each left row's distances.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Selection {
    /// The k nearest (for a similarity: the k largest), ties to the earlier right row.
    Nearest(usize),
    /// Every pair within the radius (for a similarity: at least the radius).
    Within(f64),
}

/// How left rows relate to right rows for `exclude_self`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProbeOptions {
    /// When set, the left batch's row `i` sits at position `first_row + i` of the self-joined
    /// input, and the right row at that same position is skipped. Signed: seen from a shard of
    /// the right side that starts after the batch's first row, the batch starts before row 0.
    pub exclude_self_from: Option<i64>,
}

impl ProbeOptions {
    /// The options for the rows of this batch from `offset` on, as a batch of their own.
    pub fn shifted(&self, offset: usize) -> Self {
        ProbeOptions {
            exclude_self_from: self.exclude_self_from.map(|first| first + offset as i64),
        }
    }

    /// The right row (of `right_rows`) that left row `row` of the batch must not be paired with.
    #[inline]
    pub fn excluded_right_row(&self, row: usize, right_rows: usize) -> Option<usize> {
        self.exclude_self_from
            .map(|first| first + row as i64)
            .filter(|&p| p >= 0 && p < right_rows as i64)
            .map(|p| p as usize)
    }
}

/// Whether a pair at `distance` is kept by a radius join (for a similarity: at least `radius`).
#[inline]
pub fn within(similarity: bool, distance: f64, radius: f64) -> bool {
    if similarity {
        distance >= radius
    } else {
        distance <= radius
    }
}
