//! Deterministic synthetic sparse data shaped like the paper's four datasets (its table 2).
//!
//! Row degrees follow a piecewise power law: the survival function `P(degree ≥ d)` is linear in
//! log-log space between knots fitted to what the paper states (mean from the density, the
//! quoted quantiles, min and max). Columns are drawn Zipf-like, with the exponent solved so that
//! the most popular column lands in about half of the rows, as in MovieLens, rather than in every
//! row as a naive Zipf(1.1) gives. Column ranks are scattered over the index range by an affine
//! bijection, so popular columns are not all at the front.
//!
//! Every batch is generated from its own seed (derived from the user's seed and the batch number),
//! so output is identical for a seed whatever the thread count, and batches can be built in parallel.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{plan_err, DataFusionError, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::vector::{sparse_vector_field, SparseBatch};

/// Rows per generated batch (and the unit of per-batch seeding: changing it changes the data).
pub const BATCH_ROWS: usize = 8192;

/// The share of rows that should contain the most popular column.
const TOP_COLUMN_SHARE: f64 = 0.5;

/// One of the paper's datasets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    MovieLens,
    NyTimes,
    Scrna,
    SecEdgar,
}

pub const SHAPE_NAMES: &[&str] = &["movielens", "nytimes", "scrna", "secedgar"];

impl FromStr for Shape {
    type Err = DataFusionError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "movielens" => Ok(Shape::MovieLens),
            "nytimes" => Ok(Shape::NyTimes),
            "scrna" => Ok(Shape::Scrna),
            "secedgar" | "sec_edgar" => Ok(Shape::SecEdgar),
            other => plan_err!("unknown shape '{other}'; valid: {}", SHAPE_NAMES.join(", ")),
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Shape::MovieLens => "movielens",
            Shape::NyTimes => "nytimes",
            Shape::Scrna => "scrna",
            Shape::SecEdgar => "secedgar",
        })
    }
}

/// The statistics of a shape at the paper's size.
#[derive(Debug, Clone, Copy)]
pub struct ShapeSpec {
    pub rows: usize,
    pub cols: usize,
    pub min_degree: usize,
    pub max_degree: usize,
    /// `(degree, P(degree >= degree))`, survival decreasing; the last one is the max.
    knots: &'static [(usize, f64)],
}

impl Shape {
    pub fn spec(self) -> ShapeSpec {
        // Knots fitted (2M samples) to table 2 and the degree-CDF caption of the paper:
        // movielens mean 97, 88% < 200; nytimes mean 204, 99% < 1K; scrna mean 1820, 98% < 5K;
        // secedgar mean 6, 99% < 10.
        match self {
            Shape::MovieLens => ShapeSpec {
                rows: 283_000,
                cols: 194_000,
                min_degree: 0,
                max_degree: 24_000,
                knots: &[
                    (0, 1.0),
                    (5, 0.93),
                    (20, 0.70),
                    (50, 0.45),
                    (200, 0.12),
                    (1000, 0.012),
                    (24_000, 1e-6),
                ],
            },
            Shape::NyTimes => ShapeSpec {
                rows: 300_000,
                cols: 102_000,
                min_degree: 0,
                max_degree: 2000,
                knots: &[
                    (0, 1.0),
                    (10, 0.99),
                    (60, 0.88),
                    (200, 0.50),
                    (1000, 0.01),
                    (2000, 1e-6),
                ],
            },
            Shape::Scrna => ShapeSpec {
                rows: 66_000,
                cols: 26_000,
                min_degree: 501,
                max_degree: 9600,
                knots: &[
                    (501, 1.0),
                    (1000, 0.80),
                    (2000, 0.40),
                    (5000, 0.02),
                    (9600, 1e-6),
                ],
            },
            Shape::SecEdgar => ShapeSpec {
                rows: 663_000,
                cols: 858_000,
                min_degree: 0,
                max_degree: 51,
                knots: &[
                    (0, 1.0),
                    (2, 0.98),
                    (5, 0.75),
                    (8, 0.30),
                    (10, 0.01),
                    (51, 1e-6),
                ],
            },
        }
    }
}

impl ShapeSpec {
    /// One row degree from a uniform `u` in [0, 1).
    fn degree(&self, u: f64) -> usize {
        let k = self.knots;
        let last = k[k.len() - 1].1;
        // Survival s in (last, 1]; degrees are shifted by one so that degree 0 has a logarithm.
        let s = (1.0 - u * (1.0 - last)).max(last);
        let seg = k.windows(2).position(|w| s > w[1].1).unwrap_or(k.len() - 2);
        let (d0, s0) = k[seg];
        let (d1, s1) = k[seg + 1];
        let (x0, x1) = (d0 as f64 + 1.0, d1 as f64 + 1.0);
        let slope = (x1 / x0).ln() / (s1 / s0).ln();
        let x = x0 * (s / s0).powf(slope);
        ((x - 1.0).floor().max(0.0) as usize).clamp(self.min_degree, self.max_degree)
    }
}

/// A seeded generator for one shape and row count.
#[derive(Debug, Clone)]
pub struct Generator {
    shape: Shape,
    spec: ShapeSpec,
    rows: usize,
    seed: u64,
    /// Cumulative Zipf weights of the column ranks, normalised to end at 1.
    cumulative: Arc<Vec<f64>>,
    /// Rank r is column `(r * mul + add) % cols`.
    mul: u64,
    add: u64,
}

impl Generator {
    /// `rows` defaults to the paper's row count; the column count and degree distribution stay
    /// those of the shape whatever the row count (degrees are capped at the column count).
    pub fn new(shape: Shape, rows: Option<usize>, seed: u64) -> Result<Self> {
        let spec = shape.spec();
        let rows = rows.unwrap_or(spec.rows);
        if rows == 0 {
            return plan_err!("--rows must be at least 1");
        }
        if rows > i32::MAX as usize {
            return plan_err!("--rows must be below 2^31");
        }
        let exponent = zipf_exponent(&spec, seed);
        let mut cumulative = Vec::with_capacity(spec.cols);
        let mut total = 0.0;
        for r in 0..spec.cols {
            total += ((r + 1) as f64).powf(-exponent);
            cumulative.push(total);
        }
        cumulative.iter_mut().for_each(|c| *c /= total);
        let mut rng = StdRng::seed_from_u64(mix(seed, u64::MAX));
        let cols = spec.cols as u64;
        let mut mul = rng.random_range(cols / 3..cols) | 1;
        while gcd(mul, cols) != 1 {
            mul += 2;
        }
        let add = rng.random_range(0..cols);
        Ok(Self {
            shape,
            spec,
            rows,
            seed,
            cumulative: Arc::new(cumulative),
            mul,
            add,
        })
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.spec.cols
    }

    pub fn spec(&self) -> &ShapeSpec {
        &self.spec
    }

    /// `id: Int64 not null`, `vec: sparse vector`.
    pub fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            sparse_vector_field("vec"),
        ]))
    }

    pub fn num_batches(&self) -> usize {
        self.rows.div_ceil(BATCH_ROWS)
    }

    /// Batch `i` (rows `i * BATCH_ROWS ..`), the same for a seed whoever asks and in which order.
    pub fn batch(&self, i: usize) -> RecordBatch {
        let start = i * BATCH_ROWS;
        let end = ((i + 1) * BATCH_ROWS).min(self.rows);
        let mut rng = StdRng::seed_from_u64(mix(self.seed, i as u64));
        let cols = self.spec.cols;
        let mut offsets = Vec::with_capacity(end - start + 1);
        offsets.push(0i32);
        let mut indices: Vec<i32> = Vec::new();
        let mut values: Vec<f32> = Vec::new();
        let mut ranks: Vec<u32> = Vec::new();
        for _ in start..end {
            let degree = self.spec.degree(rng.random::<f64>()).min(cols);
            self.sample_ranks(&mut rng, degree, &mut ranks);
            let first = values.len();
            for &r in &ranks {
                values.push(self.value(&mut rng, r));
            }
            let mut row: Vec<(i32, f32)> = ranks
                .iter()
                .zip(&values[first..])
                .map(|(&r, &v)| (((r as u64 * self.mul + self.add) % cols as u64) as i32, v))
                .collect();
            row.sort_unstable_by_key(|e| e.0);
            if matches!(self.shape, Shape::NyTimes | Shape::SecEdgar) {
                // TF-IDF rows are l2-normalised, as scikit-learn's TfidfVectorizer does.
                let norm = row.iter().map(|e| (e.1 as f64).powi(2)).sum::<f64>().sqrt();
                row.iter_mut()
                    .for_each(|e| e.1 = (e.1 as f64 / norm) as f32);
            }
            values.truncate(first);
            for (i, v) in row {
                indices.push(i);
                values.push(v);
            }
            offsets.push(indices.len() as i32);
        }
        let vectors = SparseBatch::from_parts(offsets.into(), indices.into(), values.into(), None);
        let ids = Int64Array::from_iter_values(start as i64..end as i64);
        RecordBatch::try_new(
            Self::schema(),
            vec![Arc::new(ids) as ArrayRef, Arc::new(vectors.to_array())],
        )
        .expect("columns match the schema")
    }

    /// All batches in order, built `window` at a time in parallel on the rayon pool.
    pub fn batches(&self) -> impl Iterator<Item = RecordBatch> + '_ {
        let window = rayon::current_num_threads().max(1) * 2;
        let n = self.num_batches();
        (0..n).step_by(window).flat_map(move |first| {
            let last = (first + window).min(n);
            (first..last)
                .into_par_iter()
                .map(|i| self.batch(i))
                .collect::<Vec<_>>()
        })
    }

    /// `degree` distinct column ranks, Zipf-weighted; sorted.
    fn sample_ranks(&self, rng: &mut StdRng, degree: usize, out: &mut Vec<u32>) {
        out.clear();
        let cols = self.spec.cols;
        // Drawing with replacement and deduplicating is cheap while the popular ranks are not
        // exhausted; a few rounds are enough for every shape, and the rest is filled uniformly
        // so that a row near the max degree cannot loop for long.
        for _ in 0..8 {
            if out.len() >= degree {
                break;
            }
            let missing = degree - out.len();
            for _ in 0..missing + missing / 4 + 1 {
                let u: f64 = rng.random();
                let r = self.cumulative.partition_point(|&c| c <= u).min(cols - 1);
                out.push(r as u32);
            }
            out.sort_unstable();
            out.dedup();
        }
        while out.len() < degree {
            let r = rng.random_range(0..cols as u32);
            if let Err(pos) = out.binary_search(&r) {
                out.insert(pos, r);
            }
        }
        if out.len() > degree {
            // Keep a random subset, not the most popular ranks, so popularity is not inflated.
            for i in 0..degree {
                let j = rng.random_range(i..out.len());
                out.swap(i, j);
            }
            out.truncate(degree);
            out.sort_unstable();
        }
    }

    /// A positive value for column rank `rank`, in the style of the dataset.
    fn value(&self, rng: &mut StdRng, rank: u32) -> f32 {
        match self.shape {
            Shape::MovieLens => {
                // Half-star ratings, skewed to 3-4 stars as on MovieLens.
                const WEIGHTS: [f64; 10] = [1.0, 3.0, 1.5, 7.0, 4.5, 20.0, 12.0, 26.0, 8.0, 15.0];
                let mut u = rng.random::<f64>() * WEIGHTS.iter().sum::<f64>();
                for (i, w) in WEIGHTS.iter().enumerate() {
                    if u < *w {
                        return (i + 1) as f32 * 0.5;
                    }
                    u -= w;
                }
                5.0
            }
            Shape::NyTimes | Shape::SecEdgar => {
                // Term count times an idf that falls with popularity.
                let p = if self.shape == Shape::NyTimes {
                    0.6
                } else {
                    0.9
                };
                let tf = 1.0 + geometric(rng, p) as f64;
                let idf = 1.0 + (1.0 + rank as f64 / 8.0).ln();
                (tf * idf) as f32
            }
            Shape::Scrna => {
                // UMI counts: integers, larger for the commonly expressed genes.
                let mean = 0.5 + 8.0 / (1.0 + rank as f64 / 50.0);
                (1 + geometric(rng, 1.0 / (1.0 + mean))) as f32
            }
        }
    }
}

/// The shape's batches for a seed: `generate(shape, rows, seed)?.collect::<Vec<_>>()`.
pub fn generate(
    shape: Shape,
    rows: Option<usize>,
    seed: u64,
) -> Result<impl Iterator<Item = RecordBatch>> {
    let g = Generator::new(shape, rows, seed)?;
    Ok((0..g.num_batches()).map(move |i| g.batch(i)))
}

/// The Zipf exponent that puts the top column in about `TOP_COLUMN_SHARE` of the rows, given the
/// shape's degrees (bisection on the with-replacement approximation `1 - (1 - p0)^d`).
fn zipf_exponent(spec: &ShapeSpec, seed: u64) -> f64 {
    let mut rng = StdRng::seed_from_u64(mix(seed, u64::MAX - 1));
    let degrees: Vec<f64> = (0..4096)
        .map(|_| spec.degree(rng.random::<f64>()) as f64)
        .collect();
    let share = |exponent: f64| {
        let h: f64 = (1..=spec.cols).map(|r| (r as f64).powf(-exponent)).sum();
        let p0 = 1.0 / h;
        degrees
            .iter()
            .map(|&d| 1.0 - (1.0 - p0).powf(d))
            .sum::<f64>()
            / degrees.len() as f64
    };
    let (mut lo, mut hi) = (0.0, 2.0);
    for _ in 0..30 {
        let mid = (lo + hi) / 2.0;
        if share(mid) < TOP_COLUMN_SHARE {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

/// Failures before the first success, success probability `p`.
fn geometric(rng: &mut StdRng, p: f64) -> u32 {
    let u: f64 = 1.0 - rng.random::<f64>();
    (u.ln() / (1.0 - p).ln()).floor().min(1e6) as u32
}

/// SplitMix64 of the seed and a stream number: independent, well-spread seeds per batch.
fn mix(seed: u64, stream: u64) -> u64 {
    let mut z = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degrees_follow_the_shape() {
        for shape in [
            Shape::MovieLens,
            Shape::NyTimes,
            Shape::Scrna,
            Shape::SecEdgar,
        ] {
            let spec = shape.spec();
            let mut rng = StdRng::seed_from_u64(3);
            let d: Vec<usize> = (0..200_000).map(|_| spec.degree(rng.random())).collect();
            let mean = d.iter().sum::<usize>() as f64 / d.len() as f64;
            let target = match shape {
                Shape::MovieLens => 97.0,
                Shape::NyTimes => 204.0,
                Shape::Scrna => 1820.0,
                Shape::SecEdgar => 6.0,
            };
            assert!((mean / target - 1.0).abs() < 0.1, "{shape}: mean {mean}");
            assert!(d
                .iter()
                .all(|&x| x >= spec.min_degree && x <= spec.max_degree));
        }
    }
}
