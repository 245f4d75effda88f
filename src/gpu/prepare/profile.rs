//! What a GPU build needs to know of a right side's columns before it prepares anything: the
//! column map, and per column its nonzeros, its values' [`dense_flags`] and whether a value lies
//! outside the dense product's range. One pass over every entry finds it; an index file keeps it
//! beside its rows (`index/file.rs`), so that a GPU build from the file makes no such pass
//! (11M nytimes rows: 1.2 s of a fresh process's 8 s).

use std::io::Write;

use rayon::prelude::*;

use super::{dense_flags, dense_value_ok, ColumnMap};
use crate::vector::SparseBatch;

/// A right side's columns: its column map and, per column id, what the dense choice reads.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ColumnProfile {
    pub(crate) columns: ColumnMap,
    /// Nonzero values per column id.
    pub(crate) counts: Vec<u64>,
    /// [`dense_flags`] of the column's nonzero values, ORed.
    pub(crate) flags: Vec<u32>,
    /// Columns holding a value outside the dense product's range ([`dense_value_ok`]).
    pub(crate) bad: Vec<bool>,
}

impl ColumnMap {
    /// The map of the rows of `pieces`: the indices themselves when the index space is not much
    /// larger than the data, else the sorted distinct indices of nonzero values.
    pub(crate) fn of(pieces: &[SparseBatch]) -> ColumnMap {
        let max_dim = pieces.iter().map(SparseBatch::max_dim).max().unwrap_or(0);
        // (the nonzeros counted only where the index space is large: a pass over every value)
        let direct = max_dim <= 1 << 20 || {
            let nonzero: usize = pieces
                .iter()
                .map(|p| entries(p).1.par_iter().filter(|v| **v != 0.0).count())
                .sum();
            max_dim <= 4 * nonzero + (1 << 20)
        };
        if direct {
            return ColumnMap::Direct(max_dim);
        }
        let mut ids: Vec<i32> = pieces
            .iter()
            .flat_map(|p| {
                let (idx, val) = entries(p);
                idx.iter()
                    .zip(val)
                    .filter(|(_, v)| **v != 0.0)
                    .map(|(i, _)| *i)
            })
            .collect();
        ids.par_sort_unstable();
        ids.dedup();
        ColumnMap::Sorted(ids)
    }
}

/// The stored entries of a batch (a null row's included: the builds skip neither).
fn entries(b: &SparseBatch) -> (&[i32], &[f32]) {
    let offsets = b.offsets();
    let (first, last) = (offsets[0] as usize, offsets[b.len()] as usize);
    (&b.indices()[first..last], &b.values()[first..last])
}

impl ColumnProfile {
    /// The profile of the rows of `pieces` (consecutive, as one right side) under `columns`.
    pub(crate) fn of(pieces: &[SparseBatch], columns: ColumnMap) -> Self {
        let ncols = columns.len();
        let segments: Vec<(&[i32], &[f32])> = pieces.iter().map(entries).collect();
        let total: usize = segments.iter().map(|s| s.0.len()).sum();
        let threads = rayon::current_num_threads().max(1);
        let nchunks = (threads * 2)
            .min((256 << 20) / (ncols.max(1) * 8))
            .min(total / (1 << 16) + 1)
            .max(1);
        // Entries `range` of the pieces laid end to end, segment by segment.
        let visit = |range: std::ops::Range<usize>, f: &mut dyn FnMut(&[i32], &[f32])| {
            let mut start = 0;
            for (idx, val) in &segments {
                let end = start + idx.len();
                let (a, b) = (range.start.max(start), range.end.min(end));
                if a < b {
                    f(&idx[a - start..b - start], &val[a - start..b - start]);
                }
                start = end;
            }
        };
        // One pass counts each column's nonzeros and ORs its values' flags, and notes whether a
        // value lies outside the product's range (rare: those chunks list their columns in a
        // second look). Separate passes for each read the entries four times.
        let per_chunk: Vec<(Vec<u32>, Vec<u32>, Vec<u32>)> = (0..nchunks)
            .into_par_iter()
            .map(|ch| {
                let range = total * ch / nchunks..total * (ch + 1) / nchunks;
                let mut counts = vec![0u32; ncols];
                let mut flags = vec![0u32; ncols];
                let mut all_ok = true;
                visit(range.clone(), &mut |idx, val| {
                    for (&c, &v) in idx.iter().zip(val) {
                        // (a stored zero may sit in a column the sorted map leaves out)
                        if v != 0.0 {
                            let id = columns.get(c).expect("a column of the right side") as usize;
                            counts[id] += 1;
                            flags[id] |= dense_flags(v);
                            all_ok &= dense_value_ok(v);
                        }
                    }
                });
                let mut bad = Vec::new();
                if !all_ok {
                    visit(range, &mut |idx, val| {
                        bad.extend(
                            idx.iter()
                                .zip(val)
                                .filter(|(_, &v)| !dense_value_ok(v))
                                .map(|(&c, _)| columns.get(c).expect("a column")),
                        )
                    });
                }
                (counts, flags, bad)
            })
            .collect();
        // Summed (and ORed) over blocks of columns on every core.
        let mut counts = vec![0u64; ncols];
        let mut flags = vec![0u32; ncols];
        counts
            .par_chunks_mut(1 << 14)
            .zip(flags.par_chunks_mut(1 << 14))
            .enumerate()
            .for_each(|(block, (sums, ors))| {
                let start = block << 14;
                let len = sums.len();
                for (c, f, _) in &per_chunk {
                    for (sum, &n) in sums.iter_mut().zip(&c[start..start + len]) {
                        *sum += n as u64;
                    }
                    for (or, &g) in ors.iter_mut().zip(&f[start..start + len]) {
                        *or |= g;
                    }
                }
            });
        let mut bad = vec![false; ncols];
        for (_, _, b) in &per_chunk {
            for &id in b {
                bad[id as usize] = true;
            }
        }
        ColumnProfile {
            columns,
            counts,
            flags,
            bad,
        }
    }

    /// The profile as bytes (little-endian): the map (0 and its length, or 1, the number of ids
    /// and the ids), then per column id its count, its flags and a byte for `bad`.
    pub(crate) fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        match &self.columns {
            ColumnMap::Direct(len) => {
                out.write_all(&0u64.to_le_bytes())?;
                out.write_all(&(*len as u64).to_le_bytes())?;
            }
            ColumnMap::Sorted(ids) => {
                out.write_all(&1u64.to_le_bytes())?;
                out.write_all(&(ids.len() as u64).to_le_bytes())?;
                for id in ids {
                    out.write_all(&id.to_le_bytes())?;
                }
            }
        }
        for c in &self.counts {
            out.write_all(&c.to_le_bytes())?;
        }
        for f in &self.flags {
            out.write_all(&f.to_le_bytes())?;
        }
        let bad: Vec<u8> = self.bad.iter().map(|&b| u8::from(b)).collect();
        out.write_all(&bad)
    }

    /// The profile written by [`ColumnProfile::write_to`], or what is wrong with `bytes`.
    pub(crate) fn read_from(bytes: &[u8]) -> std::result::Result<Self, String> {
        let mut at = 0usize;
        let mut take = |n: usize| -> std::result::Result<&[u8], String> {
            let end = at
                .checked_add(n)
                .filter(|&e| e <= bytes.len())
                .ok_or("a column profile cut short")?;
            let slice = &bytes[at..end];
            at = end;
            Ok(slice)
        };
        let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let kind = u64_at(take(8)?);
        let len = usize::try_from(u64_at(take(8)?)).map_err(|_| "a column count past usize")?;
        let columns = match kind {
            0 => ColumnMap::Direct(len),
            1 => {
                let raw = take(len.checked_mul(4).ok_or("too many column ids")?)?;
                let ids: Vec<i32> = raw
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
                    .collect();
                if ids.windows(2).any(|w| w[0] >= w[1]) {
                    return Err("a column profile's ids are not sorted".into());
                }
                ColumnMap::Sorted(ids)
            }
            _ => return Err(format!("a column profile of unknown kind {kind}")),
        };
        let ncols = columns.len();
        let counts = take(ncols.checked_mul(8).ok_or("too many columns")?)?
            .chunks_exact(8)
            .map(u64_at)
            .collect();
        let flags = take(ncols * 4)?
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        let bad = take(ncols)?.iter().map(|&b| b != 0).collect();
        if at != bytes.len() {
            return Err("a column profile followed by stray bytes".into());
        }
        Ok(ColumnProfile {
            columns,
            counts,
            flags,
            bad,
        })
    }
}
