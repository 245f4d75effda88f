//! Conversion of every accepted vector type into the canonical CSR form.

use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, MapArray, StructArray};
use arrow::buffer::{NullBuffer, ScalarBuffer};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Fields, Float32Type, Float64Type, Int32Type, Int64Type};
use datafusion::common::{exec_err, Result};

use super::{SparseBatch, VectorCheck, INDICES, VALUES};

/// `Struct{indices: List<Int32 not null>, values: List<Float32 not null>}`.
pub fn sparse_vector_type() -> DataType {
    DataType::Struct(Fields::from(vec![
        Field::new(INDICES, DataType::new_list(DataType::Int32, false), false),
        Field::new(VALUES, DataType::new_list(DataType::Float32, false), false),
    ]))
}

pub fn sparse_vector_field(name: &str) -> Field {
    Field::new(name, sparse_vector_type(), true)
}

fn is_index_type(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
    )
}

fn is_value_type(t: &DataType) -> bool {
    matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
}

fn list_item(t: &DataType) -> Option<&DataType> {
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            Some(f.data_type())
        }
        _ => None,
    }
}

/// Whether a column of this type is accepted where a sparse vector is expected.
pub fn is_sparse_vector_type(t: &DataType) -> bool {
    match t {
        DataType::Struct(fields) => {
            let idx = fields.iter().find(|f| f.name() == INDICES);
            let val = fields.iter().find(|f| f.name() == VALUES);
            match (idx, val) {
                (Some(i), Some(v)) => {
                    list_item(i.data_type()).is_some_and(is_index_type)
                        && list_item(v.data_type()).is_some_and(is_value_type)
                }
                _ => false,
            }
        }
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => {
                is_index_type(kv[0].data_type()) && is_value_type(kv[1].data_type())
            }
            _ => false,
        },
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _) => {
            list_item(t).is_some_and(is_value_type)
        }
        _ => false,
    }
}

/// A list-like array taken apart: per-row ranges into a flat child, and the row nulls.
struct ListParts {
    ranges: Vec<(usize, usize)>,
    child: ArrayRef,
    nulls: Option<NullBuffer>,
}

fn list_parts(array: &dyn Array, check: &VectorCheck, what: &str) -> Result<ListParts> {
    let ranges_of = |o: &[usize]| o.windows(2).map(|w| (w[0], w[1])).collect::<Vec<_>>();
    let parts = match array.data_type() {
        DataType::List(_) => {
            let l = array.as_list::<i32>();
            let o: Vec<usize> = l.offsets().iter().map(|&x| x as usize).collect();
            ListParts {
                ranges: ranges_of(&o),
                child: l.values().clone(),
                nulls: l.nulls().cloned(),
            }
        }
        DataType::LargeList(_) => {
            let l = array.as_list::<i64>();
            let o: Vec<usize> = l.offsets().iter().map(|&x| x as usize).collect();
            ListParts {
                ranges: ranges_of(&o),
                child: l.values().clone(),
                nulls: l.nulls().cloned(),
            }
        }
        DataType::FixedSizeList(_, n) => {
            let l: &FixedSizeListArray = array.as_fixed_size_list();
            let n = *n as usize;
            let ranges = (0..l.len()).map(|r| (r * n, r * n + n)).collect();
            ListParts {
                ranges,
                child: l.values().clone(),
                nulls: l.nulls().cloned(),
            }
        }
        other => {
            return exec_err!(
                "{}: {what} must be a list, found {other}",
                check.column_label()
            )
        }
    };
    Ok(parts.rebased())
}

impl ListParts {
    /// Only the child entries the rows use: a slice of a large array (one chunk of a column of
    /// billions of entries) then converts in time proportional to its own entries.
    fn rebased(mut self) -> Self {
        let lo = self.ranges.first().map_or(0, |r| r.0);
        let hi = self.ranges.last().map_or(0, |r| r.1);
        if lo > 0 || hi < self.child.len() {
            self.child = self.child.slice(lo, hi - lo);
            for r in &mut self.ranges {
                *r = (r.0 - lo, r.1 - lo);
            }
        }
        self
    }
}

/// Cumulative stored entries at each row boundary (`rows + 1` values from 0), for cutting a
/// column into chunks before converting it; None for types without per-row lists (Null).
fn entry_boundaries(array: &dyn Array) -> Option<Vec<u64>> {
    let from_offsets = |o: Vec<u64>| -> Vec<u64> {
        let first = o.first().copied().unwrap_or(0);
        o.into_iter().map(|x| x - first).collect()
    };
    let list = |a: &dyn Array| -> Option<Vec<u64>> {
        match a.data_type() {
            DataType::List(_) => Some(from_offsets(
                a.as_list::<i32>()
                    .offsets()
                    .iter()
                    .map(|&x| x as u64)
                    .collect(),
            )),
            DataType::LargeList(_) => Some(from_offsets(
                a.as_list::<i64>()
                    .offsets()
                    .iter()
                    .map(|&x| x as u64)
                    .collect(),
            )),
            DataType::FixedSizeList(_, n) => {
                Some((0..=a.len() as u64).map(|r| r * *n as u64).collect())
            }
            _ => None,
        }
    };
    match array.data_type() {
        DataType::Struct(_) => list(array.as_struct().column_by_name(INDICES)?.as_ref()),
        DataType::Map(_, _) => Some(from_offsets(
            array.as_map().offsets().iter().map(|&x| x as u64).collect(),
        )),
        _ => list(array),
    }
}

/// Converts `array` as consecutive row ranges of at most `max_entries` stored entries each
/// (a row with more is a range of its own), so a column of more than 2^31 entries (`LargeList`)
/// becomes several batches with 32-bit offsets instead of an error.
pub(super) fn to_sparse_batches(
    array: &dyn Array,
    check: &VectorCheck,
    max_entries: usize,
) -> Result<Vec<SparseBatch>> {
    let bounds = match entry_boundaries(array) {
        Some(b) if b.last().copied().unwrap_or(0) > max_entries as u64 => b,
        _ => return Ok(vec![to_sparse_batch(array, check)?]),
    };
    let mut out = Vec::new();
    let mut start = 0usize;
    while start < array.len() {
        let mut end = start + 1;
        while end < array.len() && bounds[end + 1] - bounds[start] <= max_entries as u64 {
            end += 1;
        }
        let part = array.slice(start, end - start);
        let part_check = check.clone().with_first_row(check.first_row + start as u64);
        out.push(to_sparse_batch(part.as_ref(), &part_check)?);
        start = end;
    }
    Ok(out)
}

/// Indices of a flat child array, widened to i64 (row checks narrow them to u32).
fn index_values(child: &ArrayRef) -> Result<Vec<i64>> {
    let c = cast(child, &DataType::Int64)?;
    Ok(c.as_primitive::<Int64Type>().values().to_vec())
}

fn float_values(child: &ArrayRef) -> Result<ArrayRef> {
    Ok(match child.data_type() {
        DataType::Float32 | DataType::Float64 => child.clone(),
        _ => cast(child, &DataType::Float64)?,
    })
}

/// Reads value `i` of a Float32 or Float64 child as f64.
fn value_reader(child: &ArrayRef) -> Box<dyn Fn(usize) -> f64 + '_> {
    match child.data_type() {
        DataType::Float32 => {
            let v = child.as_primitive::<Float32Type>();
            Box::new(move |i| v.value(i) as f64)
        }
        _ => {
            let v = child.as_primitive::<Float64Type>();
            Box::new(move |i| v.value(i))
        }
    }
}

pub(super) fn to_sparse_batch(array: &dyn Array, check: &VectorCheck) -> Result<SparseBatch> {
    match array.data_type() {
        DataType::Struct(_) if is_sparse_vector_type(array.data_type()) => {
            from_struct(array.as_struct(), check)
        }
        DataType::Map(_, _) if is_sparse_vector_type(array.data_type()) => {
            from_map(array.as_map(), check)
        }
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _)
            if is_sparse_vector_type(array.data_type()) =>
        {
            from_dense(array, check)
        }
        DataType::Null => {
            let n = array.len();
            Ok(SparseBatch::from_parts(
                vec![0i32; n + 1].into(),
                ScalarBuffer::from(Vec::<i32>::new()),
                ScalarBuffer::from(Vec::<f32>::new()),
                Some(NullBuffer::new_null(n)),
            ))
        }
        other => exec_err!(
            "{} has type {other}, which is not a sparse vector; accepted: \
             Struct{{indices: List<Int32|UInt32|Int64>, values: List<Float32|Float64>}} (or LargeList), \
             Map<Int32, Float32>, or a dense List/FixedSizeList of Float32|Float64",
            check.column_label()
        ),
    }
}

fn from_struct(array: &StructArray, check: &VectorCheck) -> Result<SparseBatch> {
    let indices = array
        .column_by_name(INDICES)
        .expect("checked by is_sparse_vector_type");
    let values = array
        .column_by_name(VALUES)
        .expect("checked by is_sparse_vector_type");

    // The canonical layout is taken as it is: the list offsets become the row pointer. Float64
    // values (numpy's and pandas' default) beside Int32 indices too, the values narrowed in one
    // pass on every core (entry by entry through the general path below, a fit of the PBMC cut
    // spent a fifth of its time converting).
    if let (DataType::List(fi), DataType::List(fv)) = (indices.data_type(), values.data_type()) {
        let float = matches!(fv.data_type(), DataType::Float32 | DataType::Float64);
        if fi.data_type() == &DataType::Int32 && float {
            let il = indices.as_list::<i32>();
            let vl = values.as_list::<i32>();
            let ic = il.values().as_primitive::<Int32Type>();
            if il.offsets() == vl.offsets() && ic.null_count() == 0 && vl.values().null_count() == 0
            {
                reject_null_lists(array.nulls(), il.nulls(), vl.nulls(), check)?;
                reject_negative_indices(array, il.offsets(), ic.values(), check)?;
                let values = match vl.values().as_primitive_opt::<Float32Type>() {
                    Some(vc) => vc.values().clone(),
                    None => {
                        let vc = vl.values().as_primitive::<Float64Type>().values();
                        narrow_values(array, il.offsets(), ic.values(), vc, check)?
                    }
                };
                return Ok(SparseBatch::from_parts(
                    il.offsets().inner().clone(),
                    ic.values().clone(),
                    values,
                    array.nulls().cloned(),
                ));
            }
        }
    }

    let ip = list_parts(indices.as_ref(), check, "field 'indices'")?;
    let vp = list_parts(values.as_ref(), check, "field 'values'")?;
    reject_null_lists(array.nulls(), ip.nulls.as_ref(), vp.nulls.as_ref(), check)?;
    build(array.len(), &ip, &vp, array.nulls().cloned(), check)
}

/// Int32 indices taken as they are: a negative one is an error (the batch reads indices as u32,
/// so it must not get there).
fn reject_negative_indices(
    array: &StructArray,
    offsets: &arrow::buffer::OffsetBuffer<i32>,
    indices: &[i32],
    check: &VectorCheck,
) -> Result<()> {
    use rayon::prelude::*;
    let (first, last) = (offsets[0] as usize, offsets[offsets.len() - 1] as usize);
    // On every core, each block without an early exit (so that it vectorises): an index file's
    // batch of a shard holds 2.1B entries.
    let negative_in = |block: &[i32]| block.iter().fold(false, |any, &i| any | (i < 0));
    let entries = &indices[first..last];
    // A lookup's few rows on the calling thread (the pool's threads woken for each would cost
    // more than the check).
    let any_negative = if entries.len() < super::SMALL_ENTRIES {
        negative_in(entries)
    } else {
        entries.par_chunks(1 << 16).any(negative_in)
    };
    if !any_negative {
        return Ok(());
    }
    for row in 0..array.len() {
        if array.is_null(row) {
            continue;
        }
        let (s, e) = (offsets[row] as usize, offsets[row + 1] as usize);
        if let Some(i) = indices[s..e].iter().find(|&&i| i < 0) {
            return exec_err!("{}: negative index {i}", check.row_label(row));
        }
    }
    Ok(())
}

/// A finite value that float32 does not hold (it would become an infinity).
fn past_float32(v: f64) -> bool {
    v.is_finite() && !(v as f32).is_finite()
}

/// Float64 values as float32, position for position; a finite value past float32's range in a
/// non-NULL row is an error (as the general path reports it), NaN and infinities pass to the
/// checks.
fn narrow_values(
    array: &StructArray,
    offsets: &arrow::buffer::OffsetBuffer<i32>,
    indices: &[i32],
    values: &[f64],
    check: &VectorCheck,
) -> Result<ScalarBuffer<f32>> {
    use rayon::prelude::*;
    // Narrowed and checked in the same pass over the values.
    let mut narrowed = vec![0f32; values.len()];
    let any_too_large = narrowed
        .par_chunks_mut(1 << 16)
        .zip(values.par_chunks(1 << 16))
        .map(|(out, block)| {
            let mut any = false;
            for (o, &v) in out.iter_mut().zip(block) {
                *o = v as f32;
                any |= v.is_finite() && !o.is_finite();
            }
            any
        })
        .reduce(|| false, |a, b| a | b);
    if any_too_large {
        for row in (0..array.len()).filter(|&r| !array.is_null(r)) {
            let (s, e) = (offsets[row] as usize, offsets[row + 1] as usize);
            if let Some(k) = (s..e).find(|&k| past_float32(values[k])) {
                return exec_err!(
                    "{}: value {:e} at index {} does not fit in float32",
                    check.row_label(row),
                    values[k],
                    indices[k]
                );
            }
        }
    }
    Ok(narrowed.into())
}

/// A NULL `indices` or `values` list inside a non-NULL vector is neither the NULL vector (that is
/// a NULL struct) nor the zero vector (empty lists): an error, rather than a guess.
fn reject_null_lists(
    rows: Option<&NullBuffer>,
    indices: Option<&NullBuffer>,
    values: Option<&NullBuffer>,
    check: &VectorCheck,
) -> Result<()> {
    for (field, lists) in [("indices", indices), ("values", values)] {
        let Some(lists) = lists else { continue };
        if lists.null_count() == 0 {
            continue;
        }
        if let Some(row) =
            (0..lists.len()).find(|&r| lists.is_null(r) && !rows.is_some_and(|n| n.is_null(r)))
        {
            return exec_err!(
                "{}: the '{field}' list is NULL inside a non-NULL vector; write a NULL vector as \
                 a NULL struct and the zero vector as empty lists",
                check.row_label(row)
            );
        }
    }
    Ok(())
}

fn from_map(array: &MapArray, check: &VectorCheck) -> Result<SparseBatch> {
    let o: Vec<usize> = array.offsets().iter().map(|&x| x as usize).collect();
    let ranges: Vec<(usize, usize)> = o.windows(2).map(|w| (w[0], w[1])).collect();
    let ip = ListParts {
        ranges: ranges.clone(),
        child: array.keys().clone(),
        nulls: None,
    }
    .rebased();
    let vp = ListParts {
        ranges,
        child: array.values().clone(),
        nulls: None,
    }
    .rebased();
    build(array.len(), &ip, &vp, array.nulls().cloned(), check)
}

/// Assembles canonical CSR from index and value lists of any accepted child types.
fn build(
    rows: usize,
    ip: &ListParts,
    vp: &ListParts,
    nulls: Option<NullBuffer>,
    check: &VectorCheck,
) -> Result<SparseBatch> {
    let idx = index_values(&ip.child)?;
    let vals = float_values(&vp.child)?;
    let read = value_reader(&vals);
    let mut offsets = Vec::with_capacity(rows + 1);
    offsets.push(0i32);
    let mut indices = Vec::new();
    let mut values = Vec::new();
    for row in 0..rows {
        let is_null = nulls.as_ref().is_some_and(|n| n.is_null(row));
        if !is_null {
            let (is, ie) = ip.ranges[row];
            let (vs, ve) = vp.ranges[row];
            if ie - is != ve - vs {
                return exec_err!(
                    "{}: indices has {} entries but values has {}; both lists of a row must have the same length",
                    check.row_label(row),
                    ie - is,
                    ve - vs
                );
            }
            for k in 0..(ie - is) {
                if ip.child.is_null(is + k) || vals.is_null(vs + k) {
                    let list = if ip.child.is_null(is + k) {
                        "indices"
                    } else {
                        "values"
                    };
                    return exec_err!(
                        "{}: null entry at position {k} of '{list}'",
                        check.row_label(row)
                    );
                }
                let i = idx[is + k];
                if i < 0 {
                    return exec_err!("{}: negative index {i}", check.row_label(row));
                }
                if i > u32::MAX as i64 {
                    return exec_err!(
                        "{}: index {i} is larger than the largest supported index {}",
                        check.row_label(row),
                        u32::MAX
                    );
                }
                let v = read(vs + k);
                if past_float32(v) {
                    return exec_err!(
                        "{}: value {v:e} at index {i} does not fit in float32",
                        check.row_label(row)
                    );
                }
                // Indices are stored as the bits of a u32 (see `SparseBatch`).
                indices.push(i as u32 as i32);
                values.push(v as f32);
            }
        }
        if indices.len() > i32::MAX as usize {
            return exec_err!(
                "{}: more than {} entries in one batch; use smaller batches",
                check.column_label(),
                i32::MAX
            );
        }
        offsets.push(indices.len() as i32);
    }
    Ok(SparseBatch::from_parts(
        offsets.into(),
        indices.into(),
        values.into(),
        nulls,
    ))
}

/// Dense lists: position is the index, zeros are dropped.
fn from_dense(array: &dyn Array, check: &VectorCheck) -> Result<SparseBatch> {
    let parts = list_parts(array, check, "a dense vector")?;
    let vals = float_values(&parts.child)?;
    let read = value_reader(&vals);
    let rows = array.len();
    let mut offsets = Vec::with_capacity(rows + 1);
    offsets.push(0i32);
    let mut indices = Vec::new();
    let mut values = Vec::new();
    for row in 0..rows {
        if !parts.nulls.as_ref().is_some_and(|n| n.is_null(row)) {
            let (s, e) = parts.ranges[row];
            for k in s..e {
                if vals.is_null(k) {
                    return exec_err!("{}: null entry at position {}", check.row_label(row), k - s);
                }
                let v = read(k);
                if v != 0.0 {
                    if k - s > i32::MAX as usize {
                        return exec_err!(
                            "{}: dense vector longer than {}",
                            check.row_label(row),
                            i32::MAX
                        );
                    }
                    indices.push((k - s) as i32);
                    values.push(v as f32);
                }
            }
        }
        if indices.len() > i32::MAX as usize {
            return exec_err!(
                "{}: more than {} nonzeros in one batch",
                check.column_label(),
                i32::MAX
            );
        }
        offsets.push(indices.len() as i32);
    }
    Ok(SparseBatch::from_parts(
        offsets.into(),
        indices.into(),
        values.into(),
        parts.nulls,
    ))
}
