//! Row checks shared by every entry point: SQL functions, join operators and the CLI.

use datafusion::common::{exec_err, Result};

use super::SparseBatch;

/// What a vector column must satisfy, and how to name it in an error.
#[derive(Debug, Clone, Default)]
pub struct VectorCheck {
    /// Column (or argument) name used in messages.
    pub column: String,
    /// Row number of the batch's first row in its input, so messages point at the input row.
    pub first_row: u64,
    /// Every index must be below this dimension.
    pub dim: Option<u64>,
    /// Name of a metric that needs values ≥ 0 (hellinger, jensenshannon, kl_divergence).
    pub nonnegative_for: Option<&'static str>,
}

impl VectorCheck {
    pub fn new(column: impl Into<String>) -> Self {
        Self {
            column: column.into(),
            ..Default::default()
        }
    }

    pub fn with_first_row(mut self, first_row: u64) -> Self {
        self.first_row = first_row;
        self
    }

    pub fn with_dim(mut self, dim: Option<u64>) -> Self {
        self.dim = dim;
        self
    }

    pub fn with_nonnegative_for(mut self, metric: Option<&'static str>) -> Self {
        self.nonnegative_for = metric;
        self
    }

    pub fn column_label(&self) -> String {
        format!("sparse vector column '{}'", self.column)
    }

    /// `row` counts from 0 within the batch; the message counts from 0 within the input.
    pub fn row_label(&self, row: usize) -> String {
        format!(
            "{}, row {}",
            self.column_label(),
            self.first_row + row as u64
        )
    }

    /// Checks every non-null row: indices in range and unique, values finite (and ≥ 0 if asked).
    pub fn validate(&self, batch: &SparseBatch) -> Result<()> {
        use rayon::prelude::*;
        // A large batch (an index file's rows come as one batch per shard: 2.1B entries took
        // 4.5 s on one core) is checked in blocks of rows on every core; the first bad row in
        // row order is the one reported, as on one core.
        const BLOCK_ENTRIES: usize = if cfg!(test) { 64 } else { 1 << 22 };
        let blocks = batch.nnz() / BLOCK_ENTRIES;
        if blocks < 2 {
            return self.validate_rows(batch, 0..batch.len());
        }
        let rows = batch.len();
        let first_error = (0..blocks)
            .into_par_iter()
            .map(|b| self.validate_rows(batch, rows * b / blocks..rows * (b + 1) / blocks))
            .collect::<Vec<_>>()
            .into_iter()
            .find(Result::is_err);
        first_error.unwrap_or(Ok(()))
    }

    fn validate_rows(&self, batch: &SparseBatch, rows: std::ops::Range<usize>) -> Result<()> {
        let mut scratch: Vec<i32> = Vec::new();
        // Every check of a row at once, without a branch per entry: a row that passes them all
        // (sorted, so no duplicate) is done; any other is checked entry by entry below, for the
        // error that names what is wrong (or, when unsorted, for duplicates).
        // (in 32 bits, order kept by flipping the sign bit: 64-bit compares do not vectorise on
        // the baseline x86-64)
        let flip = |i: i32| (i as u32 ^ 0x8000_0000) as i32;
        let below = self
            .dim
            .filter(|&d| d < 1 << 32)
            .map(|d| flip(d as u32 as i32));
        let nonnegative = self.nonnegative_for.is_some();
        let passes = |indices: &[i32], values: &[f32]| {
            let in_range =
                below.is_none_or(|b| indices.iter().fold(true, |ok, &i| ok & (flip(i) < b)));
            let sorted = indices
                .windows(2)
                .fold(true, |ok, w| ok & (flip(w[1]) > flip(w[0])));
            let values_ok = values.iter().fold(true, |ok, &v| {
                ok & v.is_finite() & !(nonnegative & (v < 0.0))
            });
            in_range & sorted & values_ok
        };
        for row in rows {
            if batch.is_null(row) {
                continue;
            }
            let (indices, values) = batch.row(row);
            if passes(indices, values) {
                continue;
            }
            let mut sorted = true;
            let mut prev = -1i64;
            for (&stored, &v) in indices.iter().zip(values) {
                // Indices are the bits of a u32 (see `SparseBatch`).
                let i = stored as u32;
                if let Some(d) = self.dim {
                    if i as u64 >= d {
                        return exec_err!(
                            "{}: index {i} is out of range for dim={d} (indices are 0-based and must be < dim)",
                            self.row_label(row)
                        );
                    }
                }
                if !v.is_finite() {
                    return exec_err!(
                        "{}: value {v} at index {i} is not finite (NaN and infinity are not allowed)",
                        self.row_label(row)
                    );
                }
                if v < 0.0 {
                    if let Some(metric) = self.nonnegative_for {
                        return exec_err!(
                            "{}: negative value {v} at index {i}; metric '{metric}' needs values >= 0",
                            self.row_label(row)
                        );
                    }
                }
                if (i as i64) == prev {
                    return exec_err!("{}: duplicate index {i}", self.row_label(row));
                }
                sorted &= (i as i64) > prev;
                prev = i as i64;
            }
            if !sorted {
                scratch.clear();
                scratch.extend_from_slice(indices);
                scratch.sort_unstable();
                if let Some(w) = scratch.windows(2).find(|w| w[0] == w[1]) {
                    return exec_err!("{}: duplicate index {}", self.row_label(row), w[0] as u32);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_checked_in_blocks_reports_its_first_bad_row() {
        // 1,000 rows of 3 entries: blocks of rows checked on every core.
        let good: Vec<(i32, f32)> = vec![(0, 1.0), (5, 2.0), (9, 3.0)];
        let mut rows: Vec<Vec<(i32, f32)>> = vec![good.clone(); 1000];
        let check = VectorCheck::new("v").with_first_row(100);
        let batch = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
        check.validate(&batch).unwrap();
        rows[977] = vec![(1, f32::NAN)];
        rows[612] = vec![(4, 1.0), (4, 2.0)];
        rows[801] = vec![(20, 1.0)];
        let batch = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
        let err = check.validate(&batch).unwrap_err().to_string();
        assert!(err.contains("row 712: duplicate index 4"), "{err}");
        let err = check
            .clone()
            .with_dim(Some(10))
            .validate(&batch)
            .unwrap_err()
            .to_string();
        assert!(err.contains("row 712"), "{err}");
        rows[612] = good.clone();
        let batch = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
        let err = check
            .with_dim(Some(10))
            .validate(&batch)
            .unwrap_err()
            .to_string();
        assert!(err.contains("row 901: index 20 is out of range"), "{err}");
    }
}
