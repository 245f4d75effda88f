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
        let mut scratch: Vec<i32> = Vec::new();
        for row in 0..batch.len() {
            if batch.is_null(row) {
                continue;
            }
            let (indices, values) = batch.row(row);
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
