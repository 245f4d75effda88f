//! The k nearest rows of each of an index's own rows, each row's own pair left out
//! (`kneighbors(X=None)`, a kNN graph), from symmetric dense blocks: each pair is computed once,
//! from the earlier row, where the probe computes it from both of its rows. The PBMC cells'
//! graph spends most of its probe streaming 1,336 dense gene columns over every cell; this
//! halves that.
//!
//! It answers only where its answer is the probe's (`exclude_self_from = 0`) bit for bit: a
//! pair summed from the other row's side adds the same terms in another order, so it must be
//! exact in any order. That holds for cosine, euclidean, sqeuclidean and manhattan (terms x·y,
//! −2·x·y, |x − y| − |x| − |y|; finishes symmetric in the two rows' totals) when every value is
//! an integer and every row's Σx² is at most 2^50: each term and partial sum is then an integer
//! below 2^53 in magnitude (|Σ x·y| ≤ √(Σx²·Σy²), and |x| ≤ x² for an integer), so f64 holds
//! it exactly. Raw counts (UMIs, words) are such rows. Elsewhere it answers `false` and the
//! caller probes.
//!
//! Rows are taken in strips that fit [`STRIP_BYTES`]: a strip's rows against the rows from its
//! first on (the symmetric block's batches), then each of its rows' nearest among those, after
//! what earlier strips offered it (its pairs with their rows), and each later row offered its
//! pairs with the strip's rows. Offers reach a row in increasing row order, as in the probe, so
//! [`TopK`] breaks ties to the earlier row the same way.

use std::ops::Range;

use datafusion::common::{exec_err, Result};
use rayon::prelude::*;

use super::dense_block::{mirror, Shape};
use super::index::CpuIndex;
use super::vectors::Vectors;
use crate::join::TopK;
use crate::metric::Metric;
use crate::vector::SparseBatch;

/// Bytes of distances of one strip (f64, strip rows × all rows).
const STRIP_BYTES: usize = 64 << 20;

/// The largest Σx² of a row whose folded sums are exact in any order (see the module docs).
const EXACT_SQUARES: f64 = (1u64 << 50) as f64;

/// Rows of a strip at most 1 << 16: past that a strip of few rows costs the block's batches.
fn strip_rows(n: usize) -> usize {
    (STRIP_BYTES / (8 * n.max(1))).max(64)
}

/// Whether [`self_nearest`] answers `metric` for `rows`: a metric named in the module docs and
/// rows of integers whose Σx² are at most 2^50 (NULL rows pass).
pub fn self_nearest_is_exact(metric: &Metric, rows: &SparseBatch) -> bool {
    sums_exact_in_any_order(metric.name(), rows)
}

/// Whether the folded sums of the metric named `metric` over `rows` are exact in any order: it
/// is cosine, euclidean, sqeuclidean or manhattan, and every row of `rows` is integers with Σx²
/// at most 2^50 (NULL rows pass; see the module docs).
pub(crate) fn sums_exact_in_any_order(metric: &str, rows: &SparseBatch) -> bool {
    matches!(metric, "cosine" | "euclidean" | "sqeuclidean" | "manhattan")
        && (0..rows.len()).into_par_iter().all(|r| {
            let (_, values) = rows.row(r);
            let mut squares = 0.0f64;
            for &v in values {
                // (a cast, not `fract`, which called libm once a value: 4% of the PBMC
                // graph; beyond i64's range it saturates, unequal, as a NaN's 0 is)
                if (v as i64) as f32 != v {
                    return false;
                }
                squares += (v as f64) * (v as f64);
            }
            squares <= EXACT_SQUARES
        })
}

/// The `k` nearest of each of `rows` among `rows`, its own pair left out, where `index` was
/// built from `rows` for `metric` (the caller vouches; their lengths are checked): row r's in
/// `distances[r * k..]` and `indices[r * k..]`, nearest first, ties to the earlier row; slots
/// not filled (a NULL row, fewer than k other rows) are left as they are. `Ok(false)`, nothing
/// written, where [`self_nearest_is_exact`] does not hold: probe instead.
pub fn self_nearest(
    index: &CpuIndex,
    rows: &SparseBatch,
    metric: &Metric,
    k: usize,
    (distances, indices): (&mut [f64], &mut [i64]),
) -> Result<bool> {
    self_nearest_in_strips(
        index,
        rows,
        (metric, k),
        (distances, indices),
        strip_rows(index.rows),
    )
}

fn self_nearest_in_strips(
    index: &CpuIndex,
    rows: &SparseBatch,
    (metric, k): (&Metric, usize),
    (distances, indices): (&mut [f64], &mut [i64]),
    strip: usize,
) -> Result<bool> {
    let n = index.rows;
    if rows.len() != n {
        return exec_err!(
            "the nearest of an index's own rows need its rows: {} rows against an index of {n}",
            rows.len()
        );
    }
    if distances.len() < n * k || indices.len() < n * k {
        return exec_err!(
            "the {k} nearest of {n} rows need {} slots, got {} distances and {} indices",
            n * k,
            distances.len(),
            indices.len()
        );
    }
    if !index.fills_dense_block() || !self_nearest_is_exact(metric, rows) {
        return Ok(false);
    }
    if n == 0 || k == 0 {
        return Ok(true);
    }
    let mut nearest: Vec<TopK> = (0..n)
        .map(|_| {
            let mut t = TopK::default();
            t.reset(k);
            t
        })
        .collect();
    let strip = strip.clamp(1, n);
    let mut block = vec![0.0f64; strip * n];
    for a in (0..n).step_by(strip) {
        let span = a..(a + strip).min(n);
        let out = &mut block[..span.len() * n];
        let shape = Shape {
            stride: n,
            symmetric: true,
            rows: span.clone(),
            // (every sum is exact: checked above)
            any_order: true,
        };
        index
            .kernels
            .dense_block(index, rows, out, shape, Vectors::chosen());
        // The strip's pairs among its own rows mirrored, so that each row reads its own
        // (exact sums: the value from either side is the same). Read across the rows above
        // it instead, one cache line a value, they were a tenth of the PBMC graph.
        mirror(&mut out[a..], span.len(), n);
        offer_strip(index, rows, &span, out, &mut nearest);
    }
    nearest
        .par_iter_mut()
        .zip(distances.par_chunks_mut(k))
        .zip(indices.par_chunks_mut(k))
        .for_each(|((topk, d), i)| {
            for (slot, (key, j)) in topk.drain_sorted().enumerate() {
                d[slot] = key;
                i[slot] = j as i64;
            }
        });
    Ok(true)
}

/// Row i's distances `row[j]` to the rows j from `first` on offered to its top k, in increasing
/// row order, but its own and the NULL rows'. Once the top k is full, eight distances at a time
/// are compared with its threshold first (one vector compare), and offered only where one is
/// below it: one offer at a time, a branch each, was an eighth of the PBMC graph.
#[inline]
fn offer_row(topk: &mut TopK, row: &[f64], first: usize, i: usize, valid: impl Fn(usize) -> bool) {
    const RUN: usize = 8;
    let mut j = first;
    while j < row.len() && !topk.is_full() {
        if j != i && valid(j) {
            topk.push(row[j], j as u32);
        }
        j += 1;
    }
    for run in row[j..].chunks(RUN) {
        let threshold = topk.threshold();
        // (a NULL row's NaN is below nothing; kept out below all the same)
        if run.iter().fold(false, |any, &d| any | (d < threshold)) {
            for (t, &d) in run.iter().enumerate() {
                if j + t != i && valid(j + t) {
                    topk.push(d, (j + t) as u32);
                }
            }
        }
        j += run.len();
    }
}

/// A strip's distances (`out[(i - a) * n + j]` for its row i and j from a on; `span` = a..b)
/// offered to the strip's rows (the pairs with rows before a: earlier strips offered them) and
/// to the later rows.
fn offer_strip(
    index: &CpuIndex,
    rows: &SparseBatch,
    span: &Range<usize>,
    out: &[f64],
    nearest: &mut [TopK],
) {
    let (n, a) = (index.rows, span.start);
    let valid = |j: usize| index.valid[j];
    let (own, later) = nearest[a..].split_at_mut(span.len());
    own.par_iter_mut().enumerate().for_each(|(r, topk)| {
        let i = a + r;
        if rows.is_null(i) {
            return;
        }
        // (the pairs with rows before i in the strip: mirrored there)
        offer_row(topk, &out[r * n..(r + 1) * n], a, i, valid);
    });
    // Rows after the strip: their pairs with its rows, a band of them at a time so that the
    // strip's rows are read along their length.
    const BAND: usize = 64;
    later
        .par_chunks_mut(BAND)
        .enumerate()
        .for_each(|(c, band)| {
            let first = span.end + c * BAND;
            for i in span.clone().filter(|&i| !rows.is_null(i)) {
                let row = &out[(i - a) * n..(i - a + 1) * n];
                for (b, topk) in band.iter_mut().enumerate() {
                    let j = first + b;
                    if !rows.is_null(j) {
                        topk.push(row[j], i as u32);
                    }
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::join::{ProbeOptions, Selection};

    /// Counts: a few columns held by most rows (dense in the index), a long tail (postings),
    /// small integers so that distances tie, duplicate rows, an empty row; rows 3 and 40 NULL.
    fn counts(rng: &mut StdRng, n: usize, scale: f32) -> SparseBatch {
        let rows: Vec<Option<Vec<(i32, f32)>>> = (0..n)
            .map(|r| {
                if r == 3 || r == 40 {
                    return None;
                }
                if r == 7 {
                    return Some(Vec::new());
                }
                let mut row = Vec::new();
                for c in 0..200 {
                    let p = if c < 20 { 0.6 } else { 3.0 / c as f64 };
                    if rng.random_bool(p) {
                        row.push((c, rng.random_range(1..5) as f32 * scale));
                    }
                }
                Some(row)
            })
            .collect();
        let mut rows = rows;
        rows[11] = rows[10].clone();
        rows[30] = rows[10].clone();
        SparseBatch::from_rows(rows.iter().map(|r| r.as_deref()))
    }

    /// The probe's k nearest with the own pair left out, as `(distances, indices)` filled as
    /// `self_nearest` fills them.
    fn probed(index: &CpuIndex, rows: &SparseBatch, k: usize) -> (Vec<f64>, Vec<i64>) {
        let n = rows.len();
        let options = ProbeOptions {
            exclude_self_from: Some(0),
        };
        let pairs = super::super::probe(index, rows, Selection::Nearest(k), options);
        let (mut d, mut ix) = (vec![f64::NAN; n * k], vec![-1i64; n * k]);
        let mut rank = vec![0usize; n];
        for p in 0..pairs.len() {
            let r = pairs.left[p] as usize;
            d[r * k + rank[r]] = pairs.distance[p];
            ix[r * k + rank[r]] = pairs.right[p] as i64;
            rank[r] += 1;
        }
        (d, ix)
    }

    /// On counts the strips give the probe's answer bit for bit (ties, NULL rows, an empty
    /// row, duplicates), for one strip and for several of uneven length, and k past the rows;
    /// small counts and counts in the thousands, with dense columns in the index (their tiles,
    /// whole and cut, in an order of their own).
    #[test]
    fn self_nearest_is_the_probe_bit_for_bit_on_counts() {
        let mut rng = StdRng::seed_from_u64(5);
        for (scale, name) in [1.0, 997.0]
            .into_iter()
            .flat_map(|s| ["cosine", "euclidean", "sqeuclidean", "manhattan"].map(|m| (s, m)))
        {
            let rows = counts(&mut rng, 300, scale);
            let n = rows.len();
            let metric = Metric::new(name, None, None).unwrap();
            let index = CpuIndex::build(&rows, &metric);
            assert!(!index.dense_vals.is_empty(), "dense columns in the index");
            for k in [1, 5, 15, 299] {
                let want = probed(&index, &rows, k);
                for strip in [n, 64, 37, 1] {
                    let (mut d, mut ix) = (vec![f64::NAN; n * k], vec![-1i64; n * k]);
                    let done = self_nearest_in_strips(
                        &index,
                        &rows,
                        (&metric, k),
                        (&mut d, &mut ix),
                        strip,
                    )
                    .unwrap();
                    assert!(done, "{name}");
                    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(ix, want.1, "{name} k={k} strip={strip}");
                    assert_eq!(bits(&d), bits(&want.0), "{name} k={k} strip={strip}");
                }
            }
        }
    }

    /// Fractions, large counts, metrics it does not answer (folded or not): `false`, nothing
    /// written.
    #[test]
    fn self_nearest_declines_where_order_could_change_bits() {
        let mut rng = StdRng::seed_from_u64(9);
        let cosine = Metric::new("cosine", None, None).unwrap();
        let fractions = counts(&mut rng, 120, 0.5);
        let large = counts(&mut rng, 120, (1u32 << 24) as f32);
        let plain = counts(&mut rng, 120, 1.0);
        let dot = Metric::new("dot", None, None).unwrap();
        let jaccard = Metric::new("jaccard", None, None).unwrap();
        let chebyshev = Metric::new("chebyshev", None, None).unwrap();
        let minkowski = Metric::new("minkowski", Some(3.0), None).unwrap();
        for (rows, metric) in [
            (&fractions, &cosine),
            (&large, &cosine),
            (&plain, &dot),
            (&plain, &jaccard),
            (&plain, &chebyshev),
            (&plain, &minkowski),
        ] {
            let index = CpuIndex::build(rows, metric);
            let (mut d, mut ix) = (vec![-3.0; 120 * 4], vec![-3i64; 120 * 4]);
            let done = self_nearest(&index, rows, metric, 4, (&mut d, &mut ix)).unwrap();
            assert!(!done, "{metric}");
            assert!(d.iter().all(|&v| v == -3.0) && ix.iter().all(|&v| v == -3));
        }
        assert!(self_nearest_is_exact(&cosine, &plain));
        let index = CpuIndex::build(&plain, &cosine);
        let err = self_nearest(&index, &plain.slice(0, 50), &cosine, 4, (&mut [], &mut []));
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("50 rows against an index of 120"));
        let err = self_nearest(&index, &plain, &cosine, 4, (&mut [0.0; 10], &mut [0; 480]));
        assert!(err.unwrap_err().to_string().contains("need 480 slots"));
    }
}
