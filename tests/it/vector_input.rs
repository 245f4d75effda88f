//! The sparse vector column: every accepted input type converts to the same rows, and every bad
//! input case of the SPEC is an error naming the column, the row and the problem.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, FixedSizeListArray, Float32Builder, Int32Builder, LargeListArray, ListArray,
    MapBuilder, StringArray, StructArray,
};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Field, Fields, Float32Type, Float64Type, Int32Type, Int64Type,
    UInt32Type,
};
use datafusion_sparse_knn::metric::Metric;
use datafusion_sparse_knn::vector::{sparse_vector_type, VectorCheck};
use datafusion_sparse_knn::SparseBatch;

type Entries = Vec<(i32, f32)>;

// ---------------------------------------------------------------------------------------------
// Builders for every accepted layout
// ---------------------------------------------------------------------------------------------

fn list<T: ArrowPrimitiveType>(rows: &[Option<Vec<T::Native>>]) -> ArrayRef {
    Arc::new(ListArray::from_iter_primitive::<T, _, _>(
        rows.iter()
            .map(|r| r.clone().map(|v| v.into_iter().map(Some))),
    ))
}

fn large_list<T: ArrowPrimitiveType>(rows: &[Option<Vec<T::Native>>]) -> ArrayRef {
    Arc::new(LargeListArray::from_iter_primitive::<T, _, _>(
        rows.iter()
            .map(|r| r.clone().map(|v| v.into_iter().map(Some))),
    ))
}

/// A `Struct{indices, values}` from two list arrays; struct-level nulls where `rows` is None.
fn struct_of(indices: ArrayRef, values: ArrayRef, valid: Option<Vec<bool>>) -> ArrayRef {
    let fields = Fields::from(vec![
        Field::new("indices", indices.data_type().clone(), true),
        Field::new("values", values.data_type().clone(), true),
    ]);
    Arc::new(StructArray::new(
        fields,
        vec![indices, values],
        valid.map(NullBuffer::from),
    ))
}

/// Struct with index type `I` and value type `V`, as List (or LargeList when `large`).
fn sparse_struct<I: ArrowPrimitiveType, V: ArrowPrimitiveType>(
    rows: &[Option<Entries>],
    large: bool,
    idx: impl Fn(i32) -> I::Native,
    val: impl Fn(f32) -> V::Native,
) -> ArrayRef {
    let is: Vec<Option<Vec<I::Native>>> = rows
        .iter()
        .map(|r| r.as_ref().map(|r| r.iter().map(|e| idx(e.0)).collect()))
        .collect();
    let vs: Vec<Option<Vec<V::Native>>> = rows
        .iter()
        .map(|r| r.as_ref().map(|r| r.iter().map(|e| val(e.1)).collect()))
        .collect();
    let valid = Some(rows.iter().map(|r| r.is_some()).collect());
    if large {
        struct_of(large_list::<I>(&is), large_list::<V>(&vs), valid)
    } else {
        struct_of(list::<I>(&is), list::<V>(&vs), valid)
    }
}

fn map_of(rows: &[Option<Entries>]) -> ArrayRef {
    let mut b = MapBuilder::new(None, Int32Builder::new(), Float32Builder::new());
    for r in rows {
        match r {
            Some(r) => {
                for &(i, v) in r {
                    b.keys().append_value(i);
                    b.values().append_value(v);
                }
                b.append(true).unwrap();
            }
            None => b.append(false).unwrap(),
        }
    }
    Arc::new(b.finish())
}

fn dense_rows(rows: &[Option<Entries>], dim: usize) -> Vec<Option<Vec<f32>>> {
    rows.iter()
        .map(|r| {
            r.as_ref().map(|r| {
                let mut d = vec![0.0f32; dim];
                for &(i, v) in r {
                    d[i as usize] = v;
                }
                d
            })
        })
        .collect()
}

fn fixed_size<T: ArrowPrimitiveType>(rows: &[Option<Vec<T::Native>>], size: i32) -> ArrayRef {
    Arc::new(FixedSizeListArray::from_iter_primitive::<T, _, _>(
        rows.iter()
            .map(|r| r.clone().map(|v| v.into_iter().map(Some))),
        size,
    ))
}

/// A row's nonzero entries sorted by index: what every layout must agree on.
fn canonical(batch: &SparseBatch, row: usize) -> Option<Entries> {
    if batch.is_null(row) {
        return None;
    }
    let (i, v) = batch.row(row);
    let mut e: Entries = i
        .iter()
        .copied()
        .zip(v.iter().copied())
        .filter(|e| e.1 != 0.0)
        .collect();
    e.sort_by_key(|e| e.0);
    Some(e)
}

fn convert(array: &dyn Array) -> SparseBatch {
    SparseBatch::try_from_array(array, &VectorCheck::new("v"))
        .unwrap_or_else(|e| panic!("{}: {e}", array.data_type()))
}

#[test]
fn every_accepted_type_converts_to_the_same_rows() {
    // Unsorted, an explicit zero, an empty vector, a NULL vector, a single nonzero.
    let rows: Vec<Option<Entries>> = vec![
        Some(vec![(3, 1.5), (0, -2.0), (5, 0.0)]),
        Some(vec![]),
        None,
        Some(vec![(7, 4.0)]),
        Some(vec![(1, 0.25), (2, 1e-20), (6, 3e7)]),
    ];
    let want: Vec<Option<Entries>> = rows
        .iter()
        .map(|r| {
            r.as_ref().map(|r| {
                let mut e: Entries = r.iter().copied().filter(|e| e.1 != 0.0).collect();
                e.sort_by_key(|e| e.0);
                e
            })
        })
        .collect();
    let dense = dense_rows(&rows, 8);
    let dense64: Vec<Option<Vec<f64>>> = dense
        .iter()
        .map(|r| r.as_ref().map(|r| r.iter().map(|&v| v as f64).collect()))
        .collect();
    let canonical_array = SparseBatch::from_rows(rows.iter().map(|r| r.as_deref())).to_array();
    assert_eq!(canonical_array.data_type(), &sparse_vector_type());
    let inputs: Vec<(&str, ArrayRef)> = vec![
        ("canonical", Arc::new(canonical_array)),
        (
            "List<Int32>/List<Float32>",
            sparse_struct::<Int32Type, Float32Type>(&rows, false, |i| i, |v| v),
        ),
        (
            "LargeList",
            sparse_struct::<Int32Type, Float32Type>(&rows, true, |i| i, |v| v),
        ),
        (
            "UInt32 indices",
            sparse_struct::<UInt32Type, Float32Type>(&rows, false, |i| i as u32, |v| v),
        ),
        (
            "Int64 indices",
            sparse_struct::<Int64Type, Float32Type>(&rows, false, |i| i as i64, |v| v),
        ),
        (
            "Float64 values",
            sparse_struct::<Int32Type, Float64Type>(&rows, false, |i| i, |v| v as f64),
        ),
        (
            "LargeList<Int64>/LargeList<Float64>",
            sparse_struct::<Int64Type, Float64Type>(&rows, true, |i| i as i64, |v| v as f64),
        ),
        ("Map<Int32, Float32>", map_of(&rows)),
        ("dense List<Float32>", list::<Float32Type>(&dense)),
        ("dense List<Float64>", list::<Float64Type>(&dense64)),
        (
            "dense LargeList<Float32>",
            large_list::<Float32Type>(&dense),
        ),
        (
            "dense FixedSizeList<Float32>",
            fixed_size::<Float32Type>(&dense, 8),
        ),
        (
            "dense FixedSizeList<Float64>",
            fixed_size::<Float64Type>(&dense64, 8),
        ),
    ];
    for (name, array) in inputs {
        let b = convert(array.as_ref());
        assert_eq!(b.len(), rows.len(), "{name}");
        let got: Vec<Option<Entries>> = (0..b.len()).map(|r| canonical(&b, r)).collect();
        assert_eq!(got, want, "{name}");
        // The empty vector is a vector (not NULL); the NULL one is NULL.
        assert!(!b.is_null(1) && b.row_len(1) == 0, "{name}: empty vector");
        assert!(b.is_null(2), "{name}: NULL vector");
        // The result is canonical and converts back to itself.
        let again = convert(&b.to_array());
        assert_eq!(
            (0..again.len())
                .map(|r| canonical(&again, r))
                .collect::<Vec<_>>(),
            want,
            "{name}"
        );
    }
}

#[test]
fn unsorted_indices_are_accepted_and_kept() {
    let rows = vec![Some(vec![(9, 1.0f32), (2, 2.0), (5, 3.0)])];
    let array = sparse_struct::<Int32Type, Float32Type>(&rows, false, |i| i, |v| v);
    let b = SparseBatch::try_from_array(array.as_ref(), &VectorCheck::new("v").with_dim(Some(10)))
        .unwrap();
    assert_eq!(b.row(0), (&[9, 2, 5][..], &[1.0f32, 2.0, 3.0][..]));
    // Their distance is that of the sorted row.
    let sorted = [(2, 2.0f32), (5, 3.0), (9, 1.0)];
    let y = [(2, 1.0f32), (9, 1.0)];
    for name in ["cosine", "chebyshev", "manhattan", "jaccard", "kl"] {
        let metric = Metric::new(name, None, None).unwrap();
        let yi: Vec<i32> = y.iter().map(|e| e.0).collect();
        let yv: Vec<f32> = y.iter().map(|e| e.1).collect();
        let si: Vec<i32> = sorted.iter().map(|e| e.0).collect();
        let sv: Vec<f32> = sorted.iter().map(|e| e.1).collect();
        assert_eq!(
            metric.distance(b.row(0), (&yi, &yv)),
            metric.distance((&si, &sv), (&yi, &yv)),
            "{name}"
        );
        assert_eq!(
            metric.distance((&yi, &yv), b.row(0)),
            metric.distance((&yi, &yv), (&si, &sv)),
            "{name}"
        );
    }
}

#[test]
fn null_vectors_in_every_position() {
    // A NULL struct, and NULL rows of Map and dense lists are NULL vectors; a NULL struct's lists
    // may be NULL too. A NULL row's hidden entries are never checked.
    let indices = list::<Int32Type>(&[Some(vec![1]), None, Some(vec![-5, -5])]);
    let values = list::<Float32Type>(&[Some(vec![1.0]), None, Some(vec![f32::NAN, 1.0])]);
    let array = struct_of(indices, values, Some(vec![true, false, false]));
    let b = SparseBatch::try_from_array(array.as_ref(), &VectorCheck::new("v").with_dim(Some(4)))
        .unwrap();
    assert_eq!(
        (b.is_null(0), b.is_null(1), b.is_null(2)),
        (false, true, true)
    );
    assert_eq!(b.row(1), (&[][..], &[][..]));
    let m = convert(map_of(&[None, Some(vec![(0, 1.0)])]).as_ref());
    assert!(m.is_null(0) && !m.is_null(1));
    let d = convert(list::<Float32Type>(&[Some(vec![0.0, 1.0]), None]).as_ref());
    assert!(!d.is_null(0) && d.is_null(1));
    // An all-zero dense row is the empty (zero) vector, not NULL.
    let z = convert(fixed_size::<Float64Type>(&[Some(vec![0.0, 0.0, 0.0])], 3).as_ref());
    assert!(!z.is_null(0) && z.row_len(0) == 0);
}

/// A NULL `indices` or `values` list inside a non-NULL vector is an error naming column and row,
/// in the canonical layout (taken as it is) and in the converted ones.
#[test]
fn a_null_list_inside_a_valid_vector_is_an_error() {
    for field in ["indices", "values"] {
        let (ind, val) = if field == "indices" {
            (
                vec![Some(vec![1]), None],
                vec![Some(vec![1.0]), Some(vec![2.0])],
            )
        } else {
            (
                vec![Some(vec![1]), Some(vec![2])],
                vec![Some(vec![1.0]), None],
            )
        };
        let canonical = struct_of(list::<Int32Type>(&ind), list::<Float32Type>(&val), None);
        let widened = struct_of(
            list::<Int64Type>(
                &ind.iter()
                    .map(|r| r.as_ref().map(|v| v.iter().map(|&i| i as i64).collect()))
                    .collect::<Vec<_>>(),
            ),
            list::<Float64Type>(
                &val.iter()
                    .map(|r| r.as_ref().map(|v| v.iter().map(|&x| x as f64).collect()))
                    .collect::<Vec<_>>(),
            ),
            None,
        );
        for array in [canonical, widened] {
            let check = VectorCheck::new("emb").with_first_row(40);
            let err = SparseBatch::try_from_array(array.as_ref(), &check)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("emb")
                    && err.contains("row 41")
                    && err.contains(&format!("'{field}' list is NULL")),
                "{err}"
            );
        }
    }
}

#[test]
fn sliced_arrays_keep_their_rows_and_row_numbers() {
    let rows: Vec<Option<Entries>> = vec![
        Some(vec![(0, 1.0)]),
        Some(vec![(1, 2.0), (2, 3.0)]),
        Some(vec![(4, 4.0)]),
        Some(vec![(3, -1.0), (3, 1.0)]),
    ];
    let full = SparseBatch::from_rows(rows.iter().map(|r| r.as_deref())).to_array();
    let part = full.slice(1, 2);
    let b = convert(&part);
    assert_eq!(canonical(&b, 0), rows[1]);
    assert_eq!(canonical(&b, 1), rows[2]);
    // The duplicate sits at row 3 of the full array, row 1 of the slice starting at row 2.
    let bad = full.slice(2, 2);
    let msg = error(&bad, &VectorCheck::new("emb").with_first_row(2));
    assert_names(&msg, "emb", 3, &["duplicate index 3"]);
}

// ---------------------------------------------------------------------------------------------
// Bad input: column, row and problem in the message
// ---------------------------------------------------------------------------------------------

fn error(array: &dyn Array, check: &VectorCheck) -> String {
    match SparseBatch::try_from_array(array, check) {
        Ok(_) => panic!("{} was accepted", array.data_type()),
        Err(e) => e.to_string(),
    }
}

/// The row number that follows "row " in a message.
fn row_in(msg: &str) -> Option<u64> {
    let at = msg.find("row ")? + 4;
    let digits: String = msg[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

fn assert_names(msg: &str, column: &str, row: u64, problem: &[&str]) {
    assert!(
        msg.contains(&format!("'{column}'")),
        "message does not name column '{column}': {msg}"
    );
    assert_eq!(
        row_in(msg),
        Some(row),
        "message does not name row {row}: {msg}"
    );
    for p in problem {
        assert!(
            msg.to_lowercase().contains(&p.to_lowercase()),
            "message does not say {p:?}: {msg}"
        );
    }
}

/// Rows with a bad row at position 1, so `with_first_row(100)` must report row 101.
fn with_bad_row(bad: Entries) -> Vec<Option<Entries>> {
    vec![
        Some(vec![(0, 1.0), (2, 2.0)]),
        Some(bad),
        Some(vec![(1, 1.0)]),
    ]
}

fn check() -> VectorCheck {
    VectorCheck::new("emb").with_first_row(100)
}

/// The same rows in the layouts that carry indices explicitly.
fn layouts(rows: &[Option<Entries>]) -> Vec<(&'static str, ArrayRef)> {
    vec![
        (
            "canonical",
            Arc::new(SparseBatch::from_rows(rows.iter().map(|r| r.as_deref())).to_array())
                as ArrayRef,
        ),
        (
            "LargeList",
            sparse_struct::<Int32Type, Float32Type>(rows, true, |i| i, |v| v),
        ),
        (
            "Int64/Float64",
            sparse_struct::<Int64Type, Float64Type>(rows, false, |i| i as i64, |v| v as f64),
        ),
        (
            "Int32/Float64",
            sparse_struct::<Int32Type, Float64Type>(rows, false, |i| i, |v| v as f64),
        ),
        ("Map", map_of(rows)),
    ]
}

#[test]
fn lists_of_different_lengths() {
    let indices = list::<Int32Type>(&[Some(vec![0]), Some(vec![1, 2]), Some(vec![3])]);
    let values = list::<Float32Type>(&[Some(vec![1.0]), Some(vec![1.0]), Some(vec![1.0, 2.0])]);
    let msg = error(struct_of(indices, values, None).as_ref(), &check());
    assert_names(
        &msg,
        "emb",
        101,
        &["indices has 2 entries but values has 1", "same length"],
    );
    // Same total length, rows shifted: still caught on the first differing row.
    let indices = large_list::<Int64Type>(&[Some(vec![0, 1]), Some(vec![2])]);
    let values = large_list::<Float64Type>(&[Some(vec![1.0]), Some(vec![1.0, 2.0])]);
    let msg = error(
        struct_of(indices, values, None).as_ref(),
        &VectorCheck::new("v2"),
    );
    assert_names(&msg, "v2", 0, &["same length"]);
}

#[test]
fn negative_index() {
    for (_, array) in layouts(&with_bad_row(vec![(4, 1.0), (-3, 2.0)])) {
        let msg = error(array.as_ref(), &check());
        assert_names(&msg, "emb", 101, &["negative index -3"]);
    }
}

#[test]
fn index_out_of_range_for_dim() {
    for (name, array) in layouts(&with_bad_row(vec![(4, 1.0), (10, 2.0)])) {
        let msg = error(array.as_ref(), &check().with_dim(Some(10)));
        assert_names(&msg, "emb", 101, &["index 10", "out of range", "dim=10"]);
        // The same rows are fine with a larger dim, and with no dim at all.
        assert!(
            SparseBatch::try_from_array(array.as_ref(), &check().with_dim(Some(11))).is_ok(),
            "{name}"
        );
        assert!(
            SparseBatch::try_from_array(array.as_ref(), &check()).is_ok(),
            "{name}"
        );
    }
    // An Int64 index beyond the Int32 range.
    let rows = vec![Some(vec![1i64 << 33]), Some(vec![0])];
    let indices = list::<Int64Type>(&rows);
    let values = list::<Float32Type>(&[Some(vec![1.0]), Some(vec![1.0])]);
    let msg = error(struct_of(indices, values, None).as_ref(), &check());
    assert_names(&msg, "emb", 100, &["index 8589934592"]);
}

#[test]
fn duplicate_index_in_sorted_and_unsorted_rows() {
    for bad in [
        vec![(1, 1.0), (1, 2.0), (2, 3.0)],
        vec![(5, 1.0), (1, 2.0), (5, 3.0)],
    ] {
        let dup = bad[0].0;
        for (_, array) in layouts(&with_bad_row(bad.clone())) {
            let msg = error(array.as_ref(), &check());
            assert_names(&msg, "emb", 101, &[&format!("duplicate index {dup}")]);
        }
    }
}

#[test]
fn nan_and_infinite_values() {
    for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for (_, array) in layouts(&with_bad_row(vec![(0, 1.0), (6, v)])) {
            let msg = error(array.as_ref(), &check());
            assert_names(&msg, "emb", 101, &["not finite", "index 6"]);
        }
        // Dense inputs too.
        let msg = error(
            list::<Float32Type>(&[Some(vec![0.0, 1.0]), Some(vec![v, 0.0])]).as_ref(),
            &check(),
        );
        assert_names(&msg, "emb", 101, &["not finite"]);
    }
    // A Float64 value beyond the float32 range would become infinite: an error too.
    let indices = list::<Int32Type>(&[Some(vec![0])]);
    let values = list::<Float64Type>(&[Some(vec![1e300])]);
    let msg = error(struct_of(indices, values, None).as_ref(), &check());
    assert_names(&msg, "emb", 100, &["float32"]);
    // The first such row is named; a NULL row's stored values are not read.
    let indices = list::<Int32Type>(&[Some(vec![0]), Some(vec![1]), Some(vec![0, 4])]);
    let values = list::<Float64Type>(&[Some(vec![1e300]), Some(vec![2.5]), Some(vec![1.0, -1e39])]);
    let valid = Some(vec![false, true, true]);
    let msg = error(struct_of(indices, values, valid).as_ref(), &check());
    assert_names(&msg, "emb", 102, &["value -1e39 at index 4", "float32"]);
}

#[test]
fn negative_values_for_the_metrics_that_need_nonnegative_ones() {
    for metric in ["hellinger", "jensenshannon", "kl_divergence"] {
        let m = Metric::new(metric, None, None).unwrap();
        assert!(m.kind.needs_nonnegative(), "{metric}");
        for (name, array) in layouts(&with_bad_row(vec![(0, 1.0), (3, -0.5)])) {
            let msg = error(
                array.as_ref(),
                &check().with_nonnegative_for(Some(m.name())),
            );
            assert_names(&msg, "emb", 101, &["negative value -0.5", metric]);
            // Other metrics take negative values.
            assert!(
                SparseBatch::try_from_array(array.as_ref(), &check()).is_ok(),
                "{name}"
            );
        }
    }
    for metric in [
        "cosine",
        "euclidean",
        "dot",
        "chebyshev",
        "canberra",
        "correlation",
    ] {
        assert!(
            !Metric::new(metric, None, Some(4))
                .unwrap()
                .kind
                .needs_nonnegative(),
            "{metric}"
        );
    }
}

#[test]
fn missing_dim_for_the_metrics_that_need_it() {
    for metric in ["hamming", "russellrao", "correlation", "HAMMING"] {
        let msg = Metric::new(metric, None, None).unwrap_err().to_string();
        assert!(
            msg.contains(&metric.to_lowercase()),
            "message does not name {metric}: {msg}"
        );
        assert!(
            msg.contains("dim"),
            "message does not say dim is missing: {msg}"
        );
        assert!(Metric::new(metric, None, Some(10)).is_ok());
    }
    for metric in ["cosine", "jaccard", "dice", "kl", "minkowski"] {
        assert!(
            Metric::new(metric, None, None).is_ok(),
            "{metric} needs no dim"
        );
    }
}

#[test]
fn null_entry_and_unsupported_types() {
    let indices = list::<Int32Type>(&[Some(vec![0]), Some(vec![0, 1])]);
    let values: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
        Some(vec![Some(1.0)]),
        Some(vec![Some(1.0), None]),
    ]));
    let msg = error(struct_of(indices, values, None).as_ref(), &check());
    assert_names(&msg, "emb", 101, &["null entry at position 1 of 'values'"]);
    // The same in the indices list names that list.
    let indices: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
        Some(vec![Some(0)]),
        Some(vec![None, Some(1)]),
    ]));
    let values = list::<Float32Type>(&[Some(vec![1.0]), Some(vec![1.0, 2.0])]);
    let msg = error(struct_of(indices, values, None).as_ref(), &check());
    assert_names(&msg, "emb", 101, &["null entry at position 0 of 'indices'"]);

    let strings = StringArray::from(vec!["{1:0.5}/5"]);
    let msg = error(&strings, &check());
    assert!(
        msg.contains("'emb'") && msg.contains("not a sparse vector"),
        "{msg}"
    );
    // A struct without the two fields is not a vector either.
    let wrong = struct_of(
        list::<Int32Type>(&[Some(vec![0])]),
        list::<Float32Type>(&[Some(vec![1.0])]),
        None,
    );
    let DataType::Struct(fields) = wrong.data_type() else {
        unreachable!()
    };
    let renamed = StructArray::new(
        Fields::from(vec![
            Field::new("keys", fields[0].data_type().clone(), true),
            Field::new("values", fields[1].data_type().clone(), true),
        ]),
        wrong
            .as_any()
            .downcast_ref::<StructArray>()
            .unwrap()
            .columns()
            .to_vec(),
        None,
    );
    let msg = error(&renamed, &check());
    assert!(
        msg.contains("'emb'") && msg.contains("not a sparse vector"),
        "{msg}"
    );
}

#[test]
fn good_rows_pass_with_every_check_enabled() {
    let rows = vec![
        Some(vec![(9, 1.0f32), (0, 0.0), (4, 2.5)]),
        Some(vec![]),
        None,
    ];
    for (name, array) in layouts(&rows) {
        let c = check()
            .with_dim(Some(10))
            .with_nonnegative_for(Some("kl_divergence"));
        let b = SparseBatch::try_from_array(array.as_ref(), &c)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(b.len(), 3, "{name}");
        assert_eq!(canonical(&b, 0), Some(vec![(4, 2.5), (9, 1.0)]), "{name}");
    }
}
