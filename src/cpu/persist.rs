//! A built [`CpuIndex`] written to and read back from an index file (`src/index/file.rs`), so that
//! a fresh process loads it instead of building it: the arrays as they are in memory, in one
//! fixed order, each with its length, each 8-aligned, so that a reader copies the small arrays
//! out of the blob and uses the postings where they lie (in an index file's mapping).
//!
//! What the metric decides (its loops, its key form, whether it is a max or an exact-union sum)
//! is not written: it is taken from the metric the file names, as the build took it. The blob
//! has no checksum of its own: the file checks each blob as a whole.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::ptr::NonNull;
use std::sync::Arc;

use arrow::alloc::Allocation;
use arrow::buffer::{Buffer, ScalarBuffer};
use arrow::datatypes::ArrowNativeType;
use datafusion::common::{exec_err, Result};

use super::dense_codes::DenseCodes;
use super::index::{ColumnMap, CpuIndex};
use super::union::UnionRows;
use crate::metric::{with_semiring, Metric, Reduction, RowTotals, Semiring};

/// Elements whose in-memory bytes are their value (no padding, every bit pattern valid).
trait Plain: Copy + Default {}
impl Plain for u8 {}
impl Plain for u32 {}
impl Plain for i32 {}
impl Plain for f32 {}
impl Plain for u64 {}
impl Plain for f64 {}

fn bytes_of<T: Plain>(values: &[T]) -> &[u8] {
    // SAFETY: `Plain` types have no padding and no invalid bit patterns.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}

fn bytes_of_mut<T: Plain>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: as above; any bytes written make valid values.
    unsafe {
        std::slice::from_raw_parts_mut(values.as_mut_ptr().cast(), std::mem::size_of_val(values))
    }
}

struct Writer<'a, W: Write> {
    out: &'a mut W,
}

impl<W: Write> Writer<'_, W> {
    fn scalar(&mut self, value: u64) -> std::io::Result<()> {
        self.out.write_all(&value.to_le_bytes())
    }

    fn array<T: Plain>(&mut self, values: &[T]) -> std::io::Result<()> {
        self.scalar(values.len() as u64)?;
        self.out.write_all(bytes_of(values))?;
        // Each array starts 8-aligned in the blob, so a reader may map it in place later.
        let pad = (8 - std::mem::size_of_val(values) % 8) % 8;
        self.out.write_all(&[0u8; 8][..pad])
    }
}

/// A blob in memory (a mapped file's section, or bytes read from a stream); `owner` keeps that
/// memory alive for the buffers made from it.
struct Blob<'a> {
    bytes: &'a [u8],
    at: usize,
    owner: Arc<dyn Allocation>,
}

impl Blob<'_> {
    /// The next array's bytes (its length, then its elements and padding), checked to lie in
    /// the blob.
    fn next_array<T: Plain>(&mut self) -> Result<(&[u8], usize)> {
        let len = self.scalar()?;
        let size = len
            .checked_mul(std::mem::size_of::<T>() as u64)
            .filter(|&s| s <= (self.bytes.len() - self.at) as u64);
        let Some(size) = size else {
            return exec_err!("the index holds an array of {len} elements past its section");
        };
        let (start, size) = (self.at, size as usize);
        let padded = size + (8 - size % 8) % 8;
        if padded > self.bytes.len() - start {
            return exec_err!("the index's arrays run past their section");
        }
        self.at += padded;
        Ok((&self.bytes[start..start + size], len as usize))
    }

    fn scalar(&mut self) -> Result<u64> {
        let Some(bytes) = self.bytes.get(self.at..self.at + 8) else {
            return exec_err!("the index's arrays run past their section");
        };
        self.at += 8;
        Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    }

    /// The next array, copied out of the blob.
    fn array<T: Plain>(&mut self) -> Result<Vec<T>> {
        let (bytes, len) = self.next_array::<T>()?;
        Ok(copied(bytes, len))
    }

    /// The next array as a buffer over the blob itself (the postings: no copy).
    fn buffer<T: Plain + ArrowNativeType>(&mut self) -> Result<ScalarBuffer<T>> {
        let owner = Arc::clone(&self.owner);
        let (bytes, len) = self.next_array::<T>()?;
        if bytes.is_empty() || !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
        {
            // (arrays start 8-aligned in a 64-aligned section of a page-aligned mapping: only
            // a file written otherwise, or unaligned bytes from a stream, land here)
            return Ok(copied(bytes, len).into());
        }
        // SAFETY: the bytes lie in the mapping `owner` keeps alive for as long as the buffer;
        // the pointer is aligned for T (checked) and `Plain` values take any bit pattern.
        let buffer = unsafe {
            Buffer::from_custom_allocation(
                NonNull::new(bytes.as_ptr() as *mut u8).expect("a mapped address"),
                bytes.len(),
                owner,
            )
        };
        Ok(ScalarBuffer::new(buffer, 0, len))
    }
}

/// `len` values of `bytes` (their exact size).
fn copied<T: Plain>(bytes: &[u8], len: usize) -> Vec<T> {
    let mut values = vec![T::default(); len];
    bytes_of_mut(&mut values).copy_from_slice(bytes);
    values
}

fn usizes(values: &[usize]) -> Vec<u64> {
    values.iter().map(|&v| v as u64).collect()
}

fn from_u64s(values: Vec<u64>) -> Vec<usize> {
    values.into_iter().map(|v| v as usize).collect()
}

impl CpuIndex {
    /// Writes the index's arrays (see the module's documentation).
    pub fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut w = Writer { out };
        w.scalar(self.rows as u64)?;
        w.scalar(self.column_count as u64)?;
        w.scalar(self.max_row_len as u64)?;
        w.array(&self.valid.iter().map(|&v| v as u8).collect::<Vec<u8>>())?;
        w.array(
            &self
                .totals
                .iter()
                .flat_map(|t| [t.t0, t.t1])
                .collect::<Vec<f64>>(),
        )?;
        w.array(&self.key_base)?;
        match &self.columns {
            ColumnMap::Direct(len) => {
                w.scalar(0)?;
                w.scalar(*len as u64)?;
            }
            ColumnMap::Hashed(map) => {
                w.scalar(1)?;
                let mut pairs: Vec<(i32, u32)> = map.iter().map(|(&c, &id)| (c, id)).collect();
                pairs.sort_unstable_by_key(|p| p.1);
                w.array(&pairs.iter().map(|p| p.0).collect::<Vec<i32>>())?;
                w.array(&pairs.iter().map(|p| p.1).collect::<Vec<u32>>())?;
            }
        }
        w.array(&usizes(&self.col_ptr))?;
        w.array(&self.col_rows)?;
        w.array(&self.col_vals)?;
        w.array(&self.dense_slot)?;
        w.array(&self.dense_vals)?;
        w.array(&self.col_lifts)?;
        w.array(&self.dense_lifts)?;
        w.array(
            &self
                .coded
                .iter()
                .flat_map(|&(a, b)| [a, b])
                .collect::<Vec<u32>>(),
        )?;
        w.array(&self.coded_vals)?;
        w.array(&self.coded_lifts)?;
        w.array(&self.col_codes)?;
        w.array(&usizes(&self.row_ptr))?;
        w.array(&self.row_cols)?;
        w.array(&self.row_vals)?;
        w.array(&self.row_entries.iter().map(|e| e.0).collect::<Vec<i32>>())?;
        w.array(&self.row_entries.iter().map(|e| e.1).collect::<Vec<f32>>())?;
        w.array(&self.one_sided)?;
        Ok(())
    }

    /// Reads an index that [`CpuIndex::write_to`] wrote for `metric`, from a blob of `len`
    /// bytes. Its arrays are checked against each other before any probe relies on them.
    pub fn read_from(metric: &Metric, input: &mut impl Read, len: u64) -> Result<Self> {
        let mut bytes = Vec::new();
        input.take(len).read_to_end(&mut bytes)?;
        if (bytes.len() as u64) < len {
            return exec_err!(
                "the index's blob is cut short ({} of {len} bytes)",
                bytes.len()
            );
        }
        let held = Arc::new(bytes);
        Self::read_mapped(metric, &held, Arc::clone(&held) as _)
    }

    /// [`CpuIndex::read_from`] over a blob of a mapped file: the postings stay where they are
    /// mapped (`owner` is the mapping, kept alive by the index).
    pub(crate) fn read_mapped(
        metric: &Metric,
        bytes: &[u8],
        owner: Arc<dyn Allocation>,
    ) -> Result<Self> {
        let mut r = Blob {
            bytes,
            at: 0,
            owner,
        };
        with_semiring!(metric, s => Self::read_with(&s, &mut r))
    }

    fn read_with<S: Semiring>(s: &S, r: &mut Blob<'_>) -> Result<Self> {
        let rows = r.scalar()? as usize;
        let column_count = r.scalar()? as usize;
        let max_row_len = r.scalar()? as usize;
        let valid: Vec<bool> = r.array::<u8>()?.into_iter().map(|v| v != 0).collect();
        let totals: Vec<RowTotals> = r
            .array::<f64>()?
            .chunks_exact(2)
            .map(|t| RowTotals { t0: t[0], t1: t[1] })
            .collect();
        let key_base = r.array::<f64>()?;
        let columns = match r.scalar()? {
            0 => ColumnMap::Direct(r.scalar()? as usize),
            1 => {
                let keys = r.array::<i32>()?;
                let ids = r.array::<u32>()?;
                if keys.len() != ids.len() {
                    return exec_err!("the index's column map is damaged");
                }
                ColumnMap::Hashed(keys.into_iter().zip(ids).collect::<HashMap<_, _>>())
            }
            tag => return exec_err!("the index's column map has an unknown kind {tag}"),
        };
        let col_ptr = from_u64s(r.array()?);
        let col_rows = r.buffer::<u32>()?;
        let col_vals = r.buffer::<f32>()?;
        let dense_slot = r.array::<u32>()?;
        let dense_vals = r.array::<f32>()?;
        let col_lifts = r.array::<f64>()?;
        let dense_lifts = r.array::<f64>()?;
        let coded: Vec<(u32, u32)> = r
            .array::<u32>()?
            .chunks_exact(2)
            .map(|p| (p[0], p[1]))
            .collect();
        let coded_vals = r.array::<f32>()?;
        let coded_lifts = r.array::<f64>()?;
        let col_codes = r.array::<u8>()?;
        let row_ptr = from_u64s(r.array()?);
        let row_cols = r.array::<u32>()?;
        let row_vals = r.array::<f32>()?;
        let entry_cols = r.array::<i32>()?;
        let entry_vals = r.array::<f32>()?;
        let one_sided = r.array::<f64>()?;
        if entry_cols.len() != entry_vals.len() {
            return exec_err!("the index's row entries are damaged");
        }
        let row_entries = entry_cols.into_iter().zip(entry_vals).collect();
        let max_reduction = S::REDUCTION == Reduction::Max;
        let mut index = CpuIndex {
            kernels: Box::new(*s),
            max_reduction,
            rows,
            valid,
            totals,
            key_form: S::KEY,
            key_base,
            columns,
            column_count,
            col_ptr,
            col_rows,
            col_vals,
            dense_slot,
            dense_vals,
            col_lifts,
            dense_lifts,
            coded,
            coded_vals,
            coded_lifts,
            col_codes,
            row_ptr,
            row_cols,
            row_vals,
            row_entries,
            one_sided,
            union_rows: UnionRows::default(),
            dense_codes: DenseCodes::default(),
            union_sum: !max_reduction && s.has_exact_term(),
            max_row_len,
            int_tiles: std::sync::OnceLock::new(),
        };
        index.check_consistent()?;
        index.dense_codes = DenseCodes::derive(s, &index);
        if index.union_sum {
            let Some(rows) = UnionRows::derive(s, &index.columns, &index.row_entries) else {
                return exec_err!("the index's row entries name columns it does not have");
            };
            index.union_rows = rows;
        }
        Ok(index)
    }

    /// The invariants the probe indexes by: a file that breaks one is refused, not probed.
    fn check_consistent(&self) -> Result<()> {
        let rows = self.rows;
        let per_row = [
            ("valid", self.valid.len()),
            ("totals", self.totals.len()),
            ("key_base", self.key_base.len()),
        ];
        for (name, len) in per_row {
            if len != rows {
                return exec_err!("the index's {name} has {len} entries for {rows} rows");
            }
        }
        let direct = match &self.columns {
            ColumnMap::Direct(len) => *len,
            ColumnMap::Hashed(map) => map.len(),
        };
        let postings = self.col_rows.len();
        let ok = direct == self.column_count
            && self.col_ptr.len() == self.column_count + 1
            && self.col_ptr.windows(2).all(|w| w[0] <= w[1])
            && self.col_ptr.last() == Some(&postings)
            && self.col_vals.len() == postings
            && self.dense_slot.len() == self.column_count
            && self.col_rows.iter().all(|&r| (r as usize) < rows)
            && (self.col_lifts.is_empty() || self.col_lifts.len() == postings)
            && (self.col_codes.is_empty() || self.col_codes.len() == postings)
            && (self.coded.is_empty() || self.coded.len() == self.column_count)
            && self.coded_lifts.len() == self.coded_vals.len()
            && self
                .coded
                .iter()
                .all(|&(a, b)| a <= b && b as usize <= self.coded_vals.len());
        let dense = self.dense_vals.len().checked_div(rows).unwrap_or(0);
        let ok = ok
            && (rows == 0 || self.dense_vals.len().is_multiple_of(rows))
            && self
                .dense_slot
                .iter()
                .all(|&s| s == super::index::SPARSE || (s as usize) < dense)
            && (self.dense_lifts.is_empty() || self.dense_lifts.len() == self.dense_vals.len());
        let row_lists = self.row_ptr.is_empty()
            || (self.row_ptr.len() == rows + 1
                && self.row_ptr.windows(2).all(|w| w[0] <= w[1])
                && self
                    .row_ptr
                    .last()
                    .is_some_and(|&end| end == self.row_entries.len().max(self.row_cols.len())));
        let maxes = self.row_cols.len() == self.row_vals.len()
            && self
                .row_cols
                .iter()
                .all(|&c| (c as usize) < self.column_count);
        let sums = self.one_sided.is_empty() || self.one_sided.len() == rows;
        if !(ok && row_lists && maxes && sums) {
            return exec_err!("the index's arrays do not agree with each other");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::join::{ProbeOptions, Selection};
    use crate::metric::MetricKind;
    use crate::vector::SparseBatch;

    fn counts(rows: usize, seed: u64) -> SparseBatch {
        let mut state = seed;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let mut offsets = vec![0i32];
        let mut indices = Vec::new();
        let mut values = Vec::new();
        for r in 0..rows {
            // Column 0 in nearly every row (dense on the right side), the rest spread out.
            let mut cols: Vec<i32> = (0..(next() % 12))
                .map(|_| (next() % 400) as i32 + 1)
                .collect();
            if r % 10 != 3 {
                cols.push(0);
            }
            cols.sort_unstable();
            cols.dedup();
            for c in cols {
                indices.push(c);
                values.push((next() % 3000 + 1) as f32);
            }
            offsets.push(indices.len() as i32);
        }
        SparseBatch::from_parts(offsets.into(), indices.into(), values.into(), None)
    }

    #[test]
    fn a_read_back_index_answers_as_the_built_one_for_every_metric() {
        let right = counts(700, 1);
        let left = counts(60, 2);
        for kind in MetricKind::all() {
            let metric = Metric::new(kind.name(), Some(3.0), Some(401)).expect("metric");
            let built = CpuIndex::build(&right, &metric);
            let mut blob = Vec::new();
            built.write_to(&mut blob).expect("written");
            let read = CpuIndex::read_from(&metric, &mut blob.as_slice(), blob.len() as u64)
                .expect("read back");
            let mut again = Vec::new();
            read.write_to(&mut again).expect("written again");
            assert_eq!(blob, again, "{}: the arrays read back differ", kind.name());
            // The same blob as a mapped file gives it: its postings are used where they lie.
            let held: Arc<Vec<u8>> = Arc::new(blob.clone());
            let mapped = CpuIndex::read_mapped(&metric, &held, Arc::clone(&held) as _)
                .expect("read in place");
            let inside = |p: *const u8| held.as_ptr_range().contains(&p);
            assert!(
                mapped.col_rows.is_empty()
                    || (inside(mapped.col_rows.as_ptr().cast())
                        && inside(mapped.col_vals.as_ptr().cast())),
                "{}: the postings were copied out of the blob",
                kind.name()
            );
            for selection in [Selection::Nearest(7), Selection::Within(1e9)] {
                let a = crate::cpu::probe(&built, &left, selection, ProbeOptions::default());
                for (b, how) in [(&read, "read"), (&mapped, "mapped")] {
                    let b = crate::cpu::probe(b, &left, selection, ProbeOptions::default());
                    let what = format!("{} {how}", kind.name());
                    assert_eq!(a.left, b.left, "{what}");
                    assert_eq!(a.right, b.right, "{what}");
                    let bits = |d: &[f64]| d.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a.distance), bits(&b.distance), "{what}");
                }
            }
        }
    }

    #[test]
    fn a_cut_or_damaged_blob_is_an_error_not_a_panic() {
        let right = counts(300, 3);
        let metric = Metric::new("cosine", None, None).expect("metric");
        let mut blob = Vec::new();
        CpuIndex::build(&right, &metric)
            .write_to(&mut blob)
            .expect("written");
        for cut in [0, 7, 8, 100, blob.len() / 2, blob.len() - 1] {
            let short = &blob[..cut];
            assert!(CpuIndex::read_from(&metric, &mut &short[..], short.len() as u64).is_err());
            let held: Arc<Vec<u8>> = Arc::new(short.to_vec());
            assert!(CpuIndex::read_mapped(&metric, &held, Arc::clone(&held) as _).is_err());
        }
        // A posting's row past the last row: refused by the consistency check.
        let index = CpuIndex::build(&right, &metric);
        let mut damaged = Vec::new();
        let mut bad = index;
        let mut rows = bad.col_rows.to_vec();
        rows[0] = 10_000;
        bad.col_rows = rows.into();
        bad.write_to(&mut damaged).expect("written");
        let err = CpuIndex::read_from(&metric, &mut damaged.as_slice(), damaged.len() as u64)
            .expect_err("damaged");
        assert!(err.to_string().contains("do not agree"), "{err}");
    }
}
