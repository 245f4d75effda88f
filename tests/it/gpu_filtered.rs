//! A masked probe (a filtered right side over a kept index) on the GPU against the CPU's, for
//! every metric on raw counts, at selectivities from every row to one and none: the same right
//! rows and ranks, distances within the metrics' GPU tolerance of the CPU's.

use datafusion_sparse_knn::cpu::CpuIndex;
use datafusion_sparse_knn::gpu::{GpuIndex, GpuOptions};
use datafusion_sparse_knn::join::{Cancel, JoinIndex, ProbeOptions, RowMask, Selection};
use datafusion_sparse_knn::metric::{Metric, MetricKind};

use crate::common::{batch, counts};

fn metric_of(kind: MetricKind) -> Metric {
    let p = (kind == MetricKind::Minkowski).then_some(3.0);
    Metric::from_kind(kind, p, kind.needs_dim().then_some(60)).unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn masked_gpu_probes_answer_as_the_cpu_for_every_metric() {
    let right = batch(&counts(1500, 61));
    let left = batch(&counts(64, 62));
    let masks: Vec<(&str, Vec<bool>)> = vec![
        ("all", vec![true; 1500]),
        ("half", (0..1500).map(|r| r % 2 == 0).collect()),
        ("1%", (0..1500).map(|r| r % 100 == 7).collect()),
        ("one", (0..1500).map(|r| r == 1234).collect()),
        ("none", vec![false; 1500]),
    ];
    for kind in MetricKind::all() {
        // Seen with --nocapture: a fresh machine compiles each metric's kernels here.
        let started = std::time::Instant::now();
        let metric = metric_of(kind);
        let cpu = CpuIndex::build(&right, &metric);
        let gpu = GpuIndex::build(&right, &metric, &GpuOptions::default())
            .unwrap_or_else(|e| panic!("{kind:?}: build: {e}"));
        eprintln!("{kind:?}: built in {:?}", started.elapsed());
        for (name, pass) in &masks {
            let mask = RowMask::new(pass.clone());
            for selection in [Selection::Nearest(9)] {
                for exclude in [None, Some(3)] {
                    let options = ProbeOptions {
                        exclude_self_from: exclude,
                    };
                    let cancel = Cancel::new();
                    let want = cpu
                        .probe_masked(&left, selection, options, &mask, &cancel)
                        .unwrap()
                        .into_pairs();
                    let got = gpu
                        .probe_masked(&left, selection, options, &mask, &cancel)
                        .unwrap()
                        .into_pairs();
                    let what = format!("{kind:?}, {name}, exclude {exclude:?}");
                    assert_eq!(got.left, want.left, "{what}: left rows");
                    for i in 0..got.len() {
                        assert!(pass[got.right[i] as usize], "{what}: a failing row");
                        let (g, w) = (got.distance[i], want.distance[i]);
                        let tol = 1e-9 * w.abs().max(1.0) + 1e-6 * w.abs();
                        // Equal first: kl_divergence's infinities differ by NaN.
                        let same = |a: f64, b: f64| a == b || (a - b).abs() <= tol;
                        assert!(same(g, w), "{what}: pair {i}: {g} against {w}");
                        if got.right[i] != want.right[i] {
                            // A near tie: either order of the two rows.
                            let near = want
                                .distance
                                .iter()
                                .zip(&want.left)
                                .any(|(&d, &l)| l == got.left[i] && same(d, g));
                            assert!(
                                near,
                                "{what}: pair {i}: right row {} against {}",
                                got.right[i], want.right[i]
                            );
                        }
                    }
                }
            }
        }
        eprintln!("{kind:?}: probed in {:?}", started.elapsed());
    }
}

/// `within=COLUMN` on the GPU: each left row's group probed as a mask of the kept index, against
/// the CPU's answer, knn and radius, with and without a filter, 40 groups and a NULL key.
#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_gpu_probes_answer_as_the_cpu() {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array};
    use datafusion_sparse_knn::join::{GroupMembers, GroupedProbe};

    let right = batch(&counts(2000, 63));
    let left = batch(&counts(100, 64));
    let right_keys: ArrayRef = Arc::new(Int64Array::from_iter(
        (0..2000).map(|r| (r % 37 != 0).then_some(r % 40)),
    ));
    let left_keys: ArrayRef = Arc::new(Int64Array::from_iter(
        (0..100).map(|r| (r % 17 != 0).then_some((r * 7) % 41)),
    ));
    let members = GroupMembers::build(&right_keys).unwrap();
    let groups = members.left_groups(&left_keys).unwrap();
    let filter = RowMask::new((0..2000).map(|r| r % 3 != 1).collect());
    for kind in [
        MetricKind::Cosine,
        MetricKind::Euclidean,
        MetricKind::JensenShannon,
    ] {
        let metric = metric_of(kind);
        let cpu = CpuIndex::build(&right, &metric);
        let gpu = GpuIndex::build(&right, &metric, &GpuOptions::default()).unwrap();
        for selection in [Selection::Nearest(7), Selection::Within(0.8)] {
            for mask in [None, Some(&filter)] {
                let probe = |index: &dyn JoinIndex| {
                    index
                        .probe_grouped(
                            &left,
                            GroupedProbe::new(&groups, &members, mask),
                            selection,
                            ProbeOptions::default(),
                            &Cancel::new(),
                        )
                        .unwrap()
                        .into_pairs()
                };
                let (want, got) = (probe(&cpu), probe(&gpu));
                let what = format!("{kind:?}, {selection:?}, filter {}", mask.is_some());
                assert!(!want.is_empty(), "{what}: some pairs");
                assert_eq!(got.len(), want.len(), "{what}: pairs");
                assert_eq!(got.left, want.left, "{what}: left rows");
                for i in 0..got.len() {
                    let (g, w) = (got.distance[i], want.distance[i]);
                    let tol = 1e-9 * w.abs().max(1.0) + 1e-6 * w.abs();
                    assert!(
                        g == w || (g - w).abs() <= tol,
                        "{what}: pair {i}: {g} against {w}"
                    );
                    if got.right[i] != want.right[i] {
                        let near = (0..want.len()).any(|j| {
                            want.left[j] == got.left[i]
                                && want.right[j] == got.right[i]
                                && (want.distance[j] - g).abs() <= tol
                        });
                        assert!(near, "{what}: pair {i}: right row {}", got.right[i]);
                    }
                }
            }
        }
    }
}

/// Kept columns for the filter tests: an id, integers with NULLs and extremes, floats that order
/// oddly (NaN, -0.0, infinities), flags with NULLs.
fn kept_columns(rows: usize) -> arrow::array::RecordBatch {
    use arrow::array::{BooleanArray, Float64Array, Int32Array, Int64Array, UInt64Array};
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;
    let mut state = 99u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 17
    };
    let id: Int64Array = (0..rows as i64).map(Some).collect();
    let big: Int64Array = (0..rows)
        .map(|i| match i % 101 {
            0 => None,
            1 => Some(i64::MAX - i as i64),
            2 => Some(i64::MIN + i as i64),
            _ => Some(next() as i64 - (1 << 45)),
        })
        .collect();
    let small: Int32Array = (0..rows)
        .map(|i| (i % 13 != 5).then(|| (next() % 2001) as i32 - 1000))
        .collect();
    let wide: UInt64Array = (0..rows).map(|_| Some(next() << 20)).collect();
    let specials = [f64::NAN, -0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY];
    let score: Float64Array = (0..rows)
        .map(|i| match i % 11 {
            0 => None,
            1 => Some(specials[i % specials.len()]),
            _ => Some(((next() % 20001) as f64 - 10000.0) / 100.0),
        })
        .collect();
    let flag: BooleanArray = (0..rows)
        .map(|i| (i % 17 != 3).then(|| next() % 4 == 0))
        .collect();
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("big", DataType::Int64, true),
        Field::new("small", DataType::Int32, true),
        Field::new("wide", DataType::UInt64, false),
        Field::new("score", DataType::Float64, true),
        Field::new("flag", DataType::Boolean, true),
    ]);
    arrow::array::RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(id),
            Arc::new(big),
            Arc::new(small),
            Arc::new(wide),
            Arc::new(score),
            Arc::new(flag),
        ],
    )
    .unwrap()
}

/// A filter's program run by the GPU's kernel over kept columns gives DataFusion's answer bit
/// for bit (rows not a multiple of 32, NULLs, wrapping arithmetic, floats by total order), and a
/// second filter over the same columns reads the copies kept on the device.
#[test]
#[ignore = "needs a CUDA GPU"]
fn filters_run_on_the_gpu_answer_as_datafusion() {
    use arrow::array::{Array, AsArray};
    use datafusion::common::DFSchema;
    use datafusion_sparse_knn::join::MaskProgram;
    let rows = 100_003;
    let right = batch(&counts(rows, 71));
    let metric = metric_of(MetricKind::Cosine);
    let gpu = GpuIndex::build(&right, &metric, &GpuOptions::default()).unwrap();
    let columns = kept_columns(rows);
    let ctx = datafusion::prelude::SessionContext::new();
    let schema = DFSchema::try_from(columns.schema().as_ref().clone()).unwrap();
    for sql in [
        "id % 10 = 3",
        "(id + 7) % 1000 = 5",
        "(id + 3) % 10000 = 6",
        "id >= 500 AND id < 90000 AND id % 2 = 1",
        "id IN (0, 31, 32, 100002)",
        "big % 7 = 2 OR big IS NULL",
        "big * 3 + id > 0",
        "big / 1000000 < -5",
        "small > -10 AND NOT flag",
        "small IN (1, 2, NULL)",
        "wide > 18446744073709551000",
        "score > 0.5 OR score = -0.0",
        "score >= 1e308",
        "flag IS NULL",
        "id < 0",
    ] {
        let logical = ctx.parse_sql_expr(sql, &schema).unwrap();
        let predicate = ctx.create_physical_expr(logical, &schema).unwrap();
        let program = MaskProgram::compile(&predicate, columns.schema().as_ref())
            .unwrap_or_else(|| panic!("{sql}: not compiled"));
        let got = gpu
            .mask_where_kept(&program, &columns)
            .unwrap()
            .unwrap_or_else(|| panic!("{sql}: not run on the GPU"));
        let want = predicate
            .evaluate(&columns)
            .unwrap()
            .into_array(rows)
            .unwrap();
        let want = want.as_boolean();
        assert_eq!(got.len(), rows, "{sql}");
        for row in 0..rows {
            let expected = want.is_valid(row) && want.value(row);
            assert_eq!(got.value(row), expected, "{sql}: row {row}");
        }
    }
}
