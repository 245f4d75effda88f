//! The dense columns of an index of small integers (raw counts) as 16-bit integers, for the
//! dense block's tiles (`dense_block::add_dense_tiles`) on CPUs with AVX-512 VNNI: one
//! `vpdpwssd` multiplies 32 pairs of 16-bit values and adds them into 16 32-bit sums, where a
//! fused multiply-add of f64 takes 8 pairs. The PBMC graph's dense tiles were half of its time.
//!
//! Exact, so the same sums as f64's in any order: every value is an integer that 16 bits hold,
//! and every row's Σx² over the dense columns is at most 2^31 − 1, so each partial sum of
//! x·y over a subset of the columns is at most √(Σx²·Σy²) < 2^31 in magnitude (Cauchy-Schwarz)
//! and the 32-bit sums neither wrap nor round. A left row is checked the same way as it comes
//! (`LeftPairs::load`); an index or a batch that fails takes the f64 tiles.
//!
//! Layout: tiles of [`ROWS`] right rows; within a tile, the dense slots in pairs (2p, 2p + 1),
//! and for each pair its rows' two values side by side, so that one left row's pair of values,
//! broadcast as one 32-bit lane, meets 16 right rows' pairs in one 512-bit load.

use std::ops::Range;

use rayon::prelude::*;

use super::index::CpuIndex;
use super::vectors::Vectors;

/// Right rows of a tile: four 512-bit registers of 32-bit sums.
pub(crate) const ROWS: usize = 64;

/// The dense columns of an index, tiled as 16-bit integers (see the module docs).
#[derive(Debug)]
pub(crate) struct IntTiles {
    /// Pairs of dense slots (the last one padded with a zero column).
    pairs: usize,
    /// `data[((t * pairs + p) * ROWS + r) * 2 + e]`: slot 2p + e of right row t·ROWS + r.
    data: Vec<i16>,
}

impl IntTiles {
    /// The tiles of `index`'s dense columns, or None where a value is not a 16-bit integer or a
    /// row's Σx² over them passes 2^31 − 1 (or the index has no dense columns).
    pub(crate) fn derive(index: &CpuIndex) -> Option<IntTiles> {
        let n = index.rows;
        let slots = index.dense_vals.len().checked_div(n).unwrap_or(0);
        if slots == 0 {
            return None;
        }
        let pairs = slots.div_ceil(2);
        let tiles = n.div_ceil(ROWS);
        let mut data = vec![0i16; tiles * pairs * ROWS * 2];
        let fits = data
            .par_chunks_mut(pairs * ROWS * 2)
            .enumerate()
            .all(|(t, tile)| {
                let rows = t * ROWS..((t + 1) * ROWS).min(n);
                let column = |slot: usize| match slot < slots {
                    true => &index.dense_vals[slot * n + rows.start..slot * n + rows.end],
                    false => &[],
                };
                let mut squares = [0i64; ROWS];
                let mut exact = true;
                // (no early exit: the loop over a pair's rows vectorises)
                for (p, pair) in tile.chunks_exact_mut(ROWS * 2).enumerate() {
                    for (e, column) in [column(2 * p), column(2 * p + 1)].into_iter().enumerate() {
                        for ((value, square), &y) in pair
                            .iter_mut()
                            .skip(e)
                            .step_by(2)
                            .zip(&mut squares)
                            .zip(column)
                        {
                            let v = y as i16;
                            exact &= v as f32 == y;
                            *value = v;
                            *square += v as i64 * v as i64;
                        }
                    }
                }
                exact && squares.iter().all(|&s| s <= i32::MAX as i64)
            });
        fits.then_some(IntTiles { pairs, data })
    }

    pub(crate) fn memory_size(&self) -> usize {
        self.data.len() * 2
    }
}

/// Whether this process takes the 16-bit tiles: AVX-512 chosen (`Vectors`) and the CPU has
/// VNNI and BW.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        Vectors::chosen() == Vectors::Avx512 && has!("avx512vnni") && has!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// A batch of left rows' dense hits as pairs of slots: (pair p, the row's values of slots 2p
/// and 2p + 1 as two 16-bit halves of one 32-bit lane), row after row.
#[derive(Debug, Default)]
pub(crate) struct LeftPairs {
    pub pairs: Vec<(u32, i32)>,
    /// Row b's are `pairs[at[b]..at[b + 1]]`.
    pub at: Vec<usize>,
    /// One 32-bit lane per pair of slots, zero between rows.
    lanes: Vec<i32>,
    touched: Vec<u32>,
}

impl LeftPairs {
    /// The pairs of `rows` (each a row's dense hits: slot, value), or false, the pairs left
    /// unfinished, where a value is not a 16-bit integer or a row's Σx² passes 2^31 − 1.
    pub(crate) fn load<'a>(
        &mut self,
        slots: usize,
        rows: impl Iterator<Item = &'a [(u32, f32)]>,
    ) -> bool {
        self.pairs.clear();
        self.at.clear();
        self.at.push(0);
        self.lanes.resize(slots.div_ceil(2), 0);
        // (a row's pairs, and one slot more for the write past the last)
        self.touched.resize(slots.div_ceil(2) + 1, 0);
        for hits in rows {
            let mut touched = 0;
            let mut squares = 0i64;
            let mut exact = true;
            for &(slot, x) in hits {
                let v = x as i16;
                exact &= v as f32 == x;
                squares += v as i64 * v as i64;
                let (p, e) = (slot as usize / 2, slot % 2);
                // (without a branch: whether a pair's other slot came first is a coin toss; a
                // zero, from a value that is no 16-bit integer, fails the row below)
                self.touched[touched] = p as u32;
                touched += ((self.lanes[p] == 0) & (v != 0)) as usize;
                self.lanes[p] |= ((v as u16 as u32) << (16 * e)) as i32;
            }
            for &p in &self.touched[..touched] {
                let lane = std::mem::take(&mut self.lanes[p as usize]);
                self.pairs.push((p, lane));
            }
            if !exact || squares > i32::MAX as i64 {
                return false;
            }
            self.at.push(self.pairs.len());
        }
        true
    }
}

/// `dense_block`'s dense tiles from the 16-bit ones: each of a batch's rows' (`left`) exact
/// sums Σ x·y with the right rows `rows` (`from..n`), times the metric's `scale`, written to
/// its accumulators (`acc[b * n + j]`; zeros where the row has no pair).
#[inline(always)]
pub(crate) fn add_tiles(
    tiles: &IntTiles,
    left: &LeftPairs,
    rows: Range<usize>,
    acc: &mut [f64],
    scale: f64,
) {
    let n = rows.end;
    for t in rows.start / ROWS..n.div_ceil(ROWS) {
        let j0 = t * ROWS;
        let part = rows.start.max(j0)..n.min(j0 + ROWS);
        for b in 0..left.at.len() - 1 {
            let pairs = &left.pairs[left.at[b]..left.at[b + 1]];
            let acc = &mut acc[b * n + part.start..b * n + part.end];
            if pairs.is_empty() {
                acc.fill(0.0);
                continue;
            }
            let sums = tile_sums(tiles, t, pairs, scale);
            acc.copy_from_slice(&sums[part.start - j0..part.end - j0]);
        }
    }
}

/// Row b's (of `left`) exact sums Σ x·y with right rows `tile·ROWS..` (one tile), times
/// `scale`, written to `out[b][..]` (ROWS each; rows past the index hold zeros' sums).
pub(crate) fn tile_sums(
    tiles: &IntTiles,
    tile: usize,
    pairs: &[(u32, i32)],
    scale: f64,
) -> [f64; ROWS] {
    let at = tile * tiles.pairs * ROWS * 2;
    let tile = &tiles.data[at..at + tiles.pairs * ROWS * 2];
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `available()` held when the caller took the tiles (IntTiles are only used
        // where it did), so the CPU has AVX-512 F, BW and VNNI.
        let sums = unsafe { vnni::sums(tile, pairs) };
        let mut out = [0.0f64; ROWS];
        for (o, &s) in out.iter_mut().zip(&sums) {
            *o = scale * s as f64;
        }
        out
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (tile, pairs, scale);
        unreachable!("16-bit tiles are only taken on x86-64 (`available`)")
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::ROWS;

    /// Σ over `pairs` of the lane's two values times each tile row's, per row: two sets of
    /// four sums (eight chains of `vpdpwssd`, whose latency is several cycles), each a pair
    /// after the other.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn sums(tile: &[i16], pairs: &[(u32, i32)]) -> [i32; ROWS] {
        let mut a = [_mm512_setzero_si512(); 4];
        let mut b = [_mm512_setzero_si512(); 4];
        let at = |p: u32| {
            let start = p as usize * ROWS * 2;
            assert!(start + ROWS * 2 <= tile.len());
            tile.as_ptr().wrapping_add(start)
        };
        let mut two = pairs.chunks_exact(2);
        for g in &mut two {
            let (p0, x0) = (at(g[0].0), _mm512_set1_epi32(g[0].1));
            let (p1, x1) = (at(g[1].0), _mm512_set1_epi32(g[1].1));
            for q in 0..4 {
                // SAFETY: within the pair's ROWS × 2 values (asserted in `at`).
                let y0 = unsafe { _mm512_loadu_si512(p0.add(q * 32) as *const __m512i) };
                let y1 = unsafe { _mm512_loadu_si512(p1.add(q * 32) as *const __m512i) };
                a[q] = _mm512_dpwssd_epi32(a[q], x0, y0);
                b[q] = _mm512_dpwssd_epi32(b[q], x1, y1);
            }
        }
        for &(p, x) in two.remainder() {
            let (p, x) = (at(p), _mm512_set1_epi32(x));
            for (q, a) in a.iter_mut().enumerate() {
                // SAFETY: as above.
                let y = unsafe { _mm512_loadu_si512(p.add(q * 32) as *const __m512i) };
                *a = _mm512_dpwssd_epi32(*a, x, y);
            }
        }
        let mut out = [0i32; ROWS];
        for q in 0..4 {
            let sum = _mm512_add_epi32(a[q], b[q]);
            // SAFETY: 16 lanes into out[q * 16..q * 16 + 16].
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().add(q * 16) as *mut __m512i, sum) };
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::metric::Metric;
    use crate::vector::SparseBatch;

    /// Rows of `dim` columns, every column held by most rows (all dense in the index), of
    /// counts in the thousands of both signs.
    fn counts(rng: &mut StdRng, n: usize, dim: i32, largest: i32) -> SparseBatch {
        let rows: Vec<Vec<(i32, f32)>> = (0..n)
            .map(|_| {
                let mut row = Vec::new();
                for c in 0..dim {
                    let v = rng.random_range(-largest..=largest) as f32;
                    if rng.random_bool(0.7) && v != 0.0 {
                        row.push((c, v));
                    }
                }
                row
            })
            .collect();
        SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())))
    }

    fn cosine() -> Metric {
        Metric::new("cosine", None, None).unwrap()
    }

    /// Every tile's sums are the float64 sums Σ x·y of a left row with each of the tile's
    /// rows (the last tile cut short, an odd number of dense columns), times the scale.
    #[test]
    fn tile_sums_are_the_exact_products() {
        let mut rng = StdRng::seed_from_u64(5);
        let right = counts(&mut rng, 300, 21, 3000);
        let left = counts(&mut rng, 5, 21, 3000);
        let index = CpuIndex::build(&right, &cosine());
        let slots = index.dense_vals.len() / index.rows;
        assert_eq!(slots, 21, "every column dense");
        let tiles = IntTiles::derive(&index).expect("counts below 2^15 fit");
        if !available() {
            // (the dense block then takes the f64 tiles: `dense_block`'s tests cover them)
            eprintln!("no AVX-512 VNNI here: the 16-bit tiles' sums are not computed");
            return;
        }
        let mut pairs = LeftPairs::default();
        let hits: Vec<Vec<(u32, f32)>> = (0..left.len())
            .map(|r| {
                let (idx, val) = left.row(r);
                idx.iter().zip(val).map(|(&c, &v)| (c as u32, v)).collect()
            })
            .collect();
        assert!(pairs.load(slots, hits.iter().map(Vec::as_slice)));
        for (b, hits) in hits.iter().enumerate() {
            for t in 0..index.rows.div_ceil(ROWS) {
                let got = tile_sums(&tiles, t, &pairs.pairs[pairs.at[b]..pairs.at[b + 1]], -2.0);
                for (r, &sum) in got.iter().enumerate() {
                    let j = t * ROWS + r;
                    let want = if j < index.rows {
                        let y = |s: u32| index.dense_vals[s as usize * index.rows + j] as f64;
                        -2.0 * hits.iter().map(|&(s, x)| x as f64 * y(s)).sum::<f64>()
                    } else {
                        0.0
                    };
                    assert_eq!(sum, want, "left row {b}, right row {j}");
                }
            }
        }
    }

    /// Values that 16 bits do not hold, fractions and rows whose Σx² passes 2^31 − 1 keep the
    /// tiles (or a batch's pairs) from being taken.
    #[test]
    fn only_small_integers_take_the_tiles() {
        let mut rng = StdRng::seed_from_u64(6);
        let fits = counts(&mut rng, 300, 9, 3000);
        assert!(IntTiles::derive(&CpuIndex::build(&fits, &cosine())).is_some());
        let with = |value: f32| {
            let mut rows: Vec<Vec<(i32, f32)>> = (0..fits.len())
                .map(|r| {
                    let (idx, val) = fits.row(r);
                    idx.iter().copied().zip(val.iter().copied()).collect()
                })
                .collect();
            rows[17] = (0..9).map(|c| (c, value)).collect();
            SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())))
        };
        for value in [40000.0, 2.5, -32769.0] {
            let index = CpuIndex::build(&with(value), &cosine());
            assert!(IntTiles::derive(&index).is_none(), "{value}");
        }
        // 9 · 16000² = 2.3e9 > 2^31 − 1, each value fitting 16 bits.
        assert!(IntTiles::derive(&CpuIndex::build(&with(16000.0), &cosine())).is_none());
        assert!(IntTiles::derive(&CpuIndex::build(&with(15000.0), &cosine())).is_some());
        let mut pairs = LeftPairs::default();
        let row = |v: f32| (0..9).map(|s| (s, v)).collect::<Vec<_>>();
        assert!(pairs.load(9, [row(15000.0)].iter().map(Vec::as_slice)));
        assert_eq!(pairs.pairs.len(), 5);
        assert_eq!(pairs.pairs[0], (0, (15000 << 16) | 15000));
        assert_eq!(pairs.pairs[4], (4, 15000), "the odd slot alone in its pair");
        assert!(!pairs.load(9, [row(16000.0)].iter().map(Vec::as_slice)));
        assert!(!pairs.load(9, [row(0.5)].iter().map(Vec::as_slice)));
        assert!(pairs.load(9, [row(-3.0)].iter().map(Vec::as_slice)));
        assert_eq!(
            pairs.pairs[0].1,
            ((-3i16 as u16 as i32) << 16) | (-3i16 as u16 as i32)
        );
    }
}
