//! Every metric against a plain float64 reference written from the SPEC table (tests/common), and
//! against scipy figures for 40 rows of the UCI KOS bag of words (tests/fixtures/kos_scipy.txt):
//! `Metric::distance` row by row, and `cpu::probe` kNN and radius results against brute force.

use crate::common;

use crate::common::{batch, random_rows, reference, rng, show, tolerance_ok, GenOptions, Row};
use datafusion_sparse_knn::cpu::{probe, CpuIndex, PairList, ProbeOptions, Selection};
use datafusion_sparse_knn::metric::{Metric, MetricKind, METRIC_NAMES};

type Entries = Vec<(i32, f32)>;

/// Every metric name of the SPEC (aliases included) with the options it needs; minkowski with
/// several degrees.
fn metric_cases(dim: u64) -> Vec<(String, Metric)> {
    let mut cases = Vec::new();
    for (name, kind) in METRIC_NAMES {
        let d = kind.needs_dim().then_some(dim);
        if *kind == MetricKind::Minkowski {
            for p in [1.0, 1.5, 2.0, 3.0] {
                cases.push((
                    format!("{name}(p={p})"),
                    Metric::new(name, Some(p), d).unwrap(),
                ));
            }
            cases.push((
                format!("{name}(default p)"),
                Metric::new(name, None, d).unwrap(),
            ));
        } else {
            cases.push((name.to_string(), Metric::new(name, None, d).unwrap()));
        }
    }
    cases
}

/// One metric per kind (minkowski with p = 3), for the slower probe checks.
fn kind_cases(dim: u64) -> Vec<Metric> {
    MetricKind::all()
        .map(|k| {
            let p = (k == MetricKind::Minkowski).then_some(3.0);
            Metric::from_kind(k, p, k.needs_dim().then_some(dim)).unwrap()
        })
        .collect()
}

fn rows_for(metric: &Metric, seed: u64, n: usize, dim: i32, extreme: bool) -> Vec<Row> {
    let o = GenOptions::new(n, dim)
        .nonnegative(metric.kind.needs_nonnegative())
        .extreme_values(extreme);
    random_rows(&mut rng(seed), &o)
}

fn reference_of(metric: &Metric, x: &[(i32, f32)], y: &[(i32, f32)]) -> f64 {
    reference(metric.kind, metric.p, metric.dim, x, y)
}

fn assert_no_failures(what: &str, failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{what}: {} failures, first ones:\n{}",
        failures.len(),
        failures
            .iter()
            .take(if std::env::var_os("SHOW_ALL_FAILURES").is_some() {
                usize::MAX
            } else {
                8
            })
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Metric::distance row by row
// ---------------------------------------------------------------------------------------------

fn check_distance_row_by_row(
    metric: &Metric,
    label: &str,
    rows: &[Row],
    failures: &mut Vec<String>,
) {
    let valid: Vec<&Entries> = rows.iter().flatten().collect();
    for x in &valid {
        for y in &valid {
            let got = metric.distance((&idx(x), &val(x)), (&idx(y), &val(y)));
            let want = reference_of(metric, x, y);
            if !tolerance_ok(metric.kind, got, want, x, y) {
                failures.push(format!(
                    "{label}: got {got:e}, reference {want:e}\n  x={}\n  y={}",
                    show(x),
                    show(y)
                ));
            }
        }
    }
}

fn idx(row: &[(i32, f32)]) -> Vec<i32> {
    row.iter().map(|e| e.0).collect()
}

fn val(row: &[(i32, f32)]) -> Vec<f32> {
    row.iter().map(|e| e.1).collect()
}

#[test]
fn spec_names_and_aliases() {
    use MetricKind::*;
    let spec = [
        ("dot", Dot),
        ("inner_product", Dot),
        ("ip", Dot),
        ("cosine", Cosine),
        ("euclidean", Euclidean),
        ("l2", Euclidean),
        ("sqeuclidean", SqEuclidean),
        ("manhattan", Manhattan),
        ("l1", Manhattan),
        ("cityblock", Manhattan),
        ("chebyshev", Chebyshev),
        ("linf", Chebyshev),
        ("minkowski", Minkowski),
        ("canberra", Canberra),
        ("braycurtis", BrayCurtis),
        ("hamming", Hamming),
        ("jaccard", Jaccard),
        ("dice", Dice),
        ("russellrao", RussellRao),
        ("correlation", Correlation),
        ("hellinger", Hellinger),
        ("jensenshannon", JensenShannon),
        ("js", JensenShannon),
        ("kl_divergence", KlDivergence),
        ("kl", KlDivergence),
    ];
    for (name, kind) in spec {
        for spelled in [
            name.to_string(),
            name.to_ascii_uppercase(),
            format!(" {name} "),
        ] {
            let parsed: MetricKind = spelled
                .parse()
                .unwrap_or_else(|e| panic!("{spelled:?}: {e}"));
            assert_eq!(parsed, kind, "{spelled:?}");
        }
        assert!(
            METRIC_NAMES.contains(&(name, kind)),
            "{name} missing from METRIC_NAMES"
        );
    }
    assert_eq!(
        METRIC_NAMES.len(),
        spec.len(),
        "METRIC_NAMES has names the SPEC does not"
    );
    assert_eq!(MetricKind::all().count(), 17);
    let err = "cosin".parse::<MetricKind>().unwrap_err().to_string();
    assert!(
        err.contains("cosin") && err.contains("cosine") && err.contains("kl_divergence"),
        "{err}"
    );
    // minkowski: p >= 1, default 2.
    assert_eq!(Metric::new("minkowski", None, None).unwrap().p, 2.0);
    for bad in [0.5, 0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(
            Metric::new("minkowski", Some(bad), None).is_err(),
            "p = {bad}"
        );
    }
}

#[test]
fn every_metric_name_matches_the_reference_row_by_row() {
    let mut failures = Vec::new();
    // A narrow dimension (dense rows, many shared columns) and a wide one (mostly disjoint rows).
    for (seed, dim, n) in [(1u64, 24i32, 50usize), (2, 3000, 50)] {
        for (name, metric) in metric_cases(dim as u64) {
            let rows = rows_for(&metric, seed, n, dim, true);
            check_distance_row_by_row(&metric, &format!("{name} dim={dim}"), &rows, &mut failures);
            // Names are case-insensitive.
            let upper = name.split('(').next().unwrap().to_ascii_uppercase();
            let m2 = Metric::new(&upper, Some(metric.p), metric.dim).unwrap();
            assert_eq!(m2.kind, metric.kind, "{upper}");
        }
    }
    assert_no_failures("Metric::distance vs reference", &failures);
}

#[test]
fn moderate_values_match_the_reference_row_by_row() {
    // Without the 1e5 / 1e-20 rows, so a failure here is not about extreme magnitudes.
    let mut failures = Vec::new();
    for (name, metric) in metric_cases(200) {
        let rows = rows_for(&metric, 3, 60, 200, false);
        check_distance_row_by_row(&metric, &name, &rows, &mut failures);
    }
    assert_no_failures("Metric::distance vs reference (moderate values)", &failures);
}

/// A metric by name and options, for the table checks.
fn m(name: &str, p: Option<f64>, dim: Option<u64>) -> Metric {
    Metric::new(name, p, dim).unwrap()
}

/// Checks the expected value of the SPEC table against both the reference and `Metric::distance`.
fn expect(metric: Metric, x: &[(i32, f32)], y: &[(i32, f32)], want: f64) {
    let r = reference_of(&metric, x, y);
    let got = metric.distance((&idx(x), &val(x)), (&idx(y), &val(y)));
    let same = |a: f64| {
        if want.is_infinite() {
            a == want
        } else {
            (a - want).abs() <= 1e-12 * want.abs().max(1.0)
        }
    };
    assert!(
        same(r),
        "reference of {metric} for {x:?}, {y:?} is {r}, the SPEC says {want}"
    );
    assert!(
        same(got),
        "{metric} for {x:?}, {y:?} is {got}, the SPEC says {want}"
    );
}

#[test]
fn spec_table_edge_cases() {
    let zero: &[(i32, f32)] = &[];
    let a = [(0, 1.0f32), (2, 2.0)];
    let b = [(1, 3.0f32), (2, 1.0)];
    // cosine: a zero vector gives 1 (either side, and both).
    expect(m("cosine", None, None), zero, &a, 1.0);
    expect(m("cosine", None, None), &a, zero, 1.0);
    expect(m("cosine", None, None), zero, zero, 1.0);
    // An all-explicit-zeros row is the zero vector too.
    expect(m("cosine", None, None), &[(4, 0.0)], &a, 1.0);
    expect(m("cosine", None, None), &a, &a, 0.0);
    expect(
        m("cosine", None, None),
        &a,
        &b,
        1.0 - 2.0 / (5f64.sqrt() * 10f64.sqrt()),
    );
    // chebyshev: 0 for two zero vectors; max over the union.
    expect(m("chebyshev", None, None), zero, zero, 0.0);
    expect(m("linf", None, None), &a, &b, 3.0);
    expect(m("chebyshev", None, None), &[(0, -5.0)], zero, 5.0);
    // euclidean / sqeuclidean never negative; exactly 0 on identical rows.
    expect(m("euclidean", None, None), &a, &a, 0.0);
    expect(m("sqeuclidean", None, None), &a, &b, 1.0 + 9.0 + 1.0);
    expect(m("l2", None, None), &a, &b, 11f64.sqrt());
    expect(m("manhattan", None, None), &a, &b, 1.0 + 3.0 + 1.0);
    // minkowski takes absolute values for every p.
    expect(
        m("minkowski", Some(3.0), None),
        &[(0, 1.0)],
        &[(0, 3.0)],
        2.0,
    );
    expect(
        m("minkowski", Some(1.5), None),
        &[(0, 4.0)],
        &[(0, 0.0), (1, 1.0)],
        (8.0f64 + 1.0).powf(1.0 / 1.5),
    );
    expect(m("minkowski", None, None), &a, &b, 11f64.sqrt());
    // canberra: 0/0 terms (explicit zeros on both sides) are 0; one-sided terms are 1.
    expect(
        m("canberra", None, None),
        &[(0, 1.0), (5, 0.0)],
        &[(5, 0.0), (1, 2.0)],
        2.0,
    );
    expect(m("canberra", None, None), zero, zero, 0.0);
    expect(m("canberra", None, None), &[(0, 1.0)], &[(0, 3.0)], 0.5);
    // braycurtis: 0 for two zero vectors.
    expect(m("braycurtis", None, None), zero, zero, 0.0);
    expect(m("braycurtis", None, None), &a, &b, 5.0 / 7.0);
    // jaccard: 0 when the union is empty; dice: 0 when both are empty.
    expect(m("jaccard", None, None), zero, zero, 0.0);
    expect(m("jaccard", None, None), &[(3, 0.0)], &[(3, 0.0)], 0.0);
    expect(m("jaccard", None, None), &a, &b, 1.0 - 1.0 / 3.0);
    expect(m("dice", None, None), zero, zero, 0.0);
    expect(m("dice", None, None), &a, &b, 1.0 - 2.0 / 4.0);
    expect(m("dice", None, None), &a, zero, 1.0);
    // hamming and russellrao over d coordinates.
    expect(m("hamming", None, Some(10)), &a, &b, 3.0 / 10.0);
    expect(m("hamming", None, Some(10)), &[(0, 1.0)], &[(0, 2.0)], 0.1);
    expect(m("hamming", None, Some(10)), zero, zero, 0.0);
    expect(m("russellrao", None, Some(10)), &a, &b, 9.0 / 10.0);
    expect(m("russellrao", None, Some(10)), zero, zero, 1.0);
    // correlation: 1 when either side is constant (zero vector, or every coordinate equal).
    let full: Vec<(i32, f32)> = (0..4).map(|i| (i, 2.5)).collect();
    expect(m("correlation", None, Some(4)), &full, &a, 1.0);
    expect(m("correlation", None, Some(4)), &a, &full, 1.0);
    expect(m("correlation", None, Some(4)), zero, &a, 1.0);
    expect(m("correlation", None, Some(4)), &a, &a, 0.0);
    // x = (1,0,2,0), y = (0,3,1,0): means 0.75 and 1; Σ(x-0.75)(y-1) = -1, Σ(x-0.75)² = 2.75,
    // Σ(y-1)² = 6.
    let (cov, vx, vy) = (-1.0f64, 2.75f64, 6.0f64);
    expect(
        m("correlation", None, Some(4)),
        &a,
        &b,
        1.0 - cov / (vx.sqrt() * vy.sqrt()),
    );
    // hellinger, jensenshannon on nonnegative rows.
    let (p, q) = ([(0, 0.25f32), (1, 0.75)], [(1, 0.5f32), (2, 0.5)]);
    let h = (0.25 + (0.75f64.sqrt() - 0.5f64.sqrt()).powi(2) + 0.5).sqrt() / 2f64.sqrt();
    expect(m("hellinger", None, None), &p, &q, h);
    let js = ((0.25 * 2f64.ln()
        + 0.75 * (0.75f64 / 0.625).ln()
        + 0.5 * (0.5f64 / 0.625).ln()
        + 0.5 * 2f64.ln())
        / 2.0)
        .sqrt();
    expect(m("jensenshannon", None, None), &p, &q, js);
    expect(m("js", None, None), &p, &p, 0.0);
    expect(m("jensenshannon", None, None), zero, zero, 0.0);
    // kl_divergence: +inf when some x > 0 has y = 0; x is the left side, so it is asymmetric.
    let narrow = [(1, 1.0f32)];
    let wide = [(0, 0.5f32), (1, 0.5)];
    expect(m("kl_divergence", None, None), &narrow, &wide, 2f64.ln());
    expect(m("kl", None, None), &wide, &narrow, f64::INFINITY);
    expect(m("kl", None, None), zero, &wide, 0.0);
    expect(m("kl", None, None), &p, &q, f64::INFINITY);
    // dot is a plain sum of products.
    expect(m("dot", None, None), &a, &b, 2.0);
    expect(m("ip", None, None), zero, &b, 0.0);
    expect(
        m("inner_product", None, None),
        &[(7, -2.0)],
        &[(7, 3.0)],
        -6.0,
    );
}

#[test]
fn unsorted_indices_and_explicit_zeros_do_not_change_any_distance() {
    let mut r = rng(11);
    for (name, metric) in metric_cases(64) {
        let rows = rows_for(&metric, 12, 30, 64, false);
        let valid: Vec<&Entries> = rows.iter().flatten().collect();
        for x in &valid {
            for y in &valid {
                let plain = metric.distance((&idx(x), &val(x)), (&idx(y), &val(y)));
                // Reversed order, plus explicit zeros at unused indices.
                let mut x2: Entries = x.iter().copied().filter(|e| e.1 != 0.0).rev().collect();
                let used: Vec<i32> = x.iter().map(|e| e.0).collect();
                if let Some(free) = (0..64).find(|i| !used.contains(i)) {
                    x2.insert(rand::Rng::random_range(&mut r, 0..=x2.len()), (free, 0.0));
                }
                let other = metric.distance((&idx(&x2), &val(&x2)), (&idx(y), &val(y)));
                let same = plain == other || (plain - other).abs() <= 1e-12 * plain.abs().max(1.0);
                assert!(
                    same,
                    "{name}: {plain} vs {other} for x={x:?} reordered to {x2:?}, y={y:?}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// cpu::probe against brute force
// ---------------------------------------------------------------------------------------------

/// Absolute slack the SPEC allows around a reference value (none around an infinite one, which
/// must be matched exactly).
fn slack(kind: MetricKind, reference: f64, x: &[(i32, f32)], y: &[(i32, f32)]) -> f64 {
    if !reference.is_finite() {
        return 0.0;
    }
    let mut s = 1e-4 * reference.abs().max(1.0);
    if matches!(
        kind,
        MetricKind::Euclidean | MetricKind::SqEuclidean | MetricKind::Correlation
    ) {
        s = s.max(1e-3 * (common::norm2sq(x) + common::norm2sq(y)).sqrt());
    }
    s
}

/// The pairs of each left row, checking that the list is grouped by ascending left row.
fn group_by_left(pairs: &PairList, left_rows: usize) -> Vec<Vec<(u32, f64)>> {
    let mut out = vec![Vec::new(); left_rows];
    assert_eq!(pairs.left.len(), pairs.right.len());
    assert_eq!(pairs.left.len(), pairs.distance.len());
    assert!(
        pairs.left.windows(2).all(|w| w[0] <= w[1]),
        "pairs are not ordered by left row"
    );
    for i in 0..pairs.len() {
        out[pairs.left[i] as usize].push((pairs.right[i], pairs.distance[i]));
    }
    out
}

/// The right rows a left row may be paired with (valid, and not itself under exclude_self).
fn candidates(right: &[Row], left_row: usize, exclude_self_from: Option<i64>) -> Vec<usize> {
    let skip = exclude_self_from.map(|f| f as usize + left_row);
    (0..right.len())
        .filter(|&j| right[j].is_some() && Some(j) != skip)
        .collect()
}

/// Checks a kNN result against reference distances `refd(i, j)`; returns the failures.
fn check_knn(
    metric: &Metric,
    left: &[Row],
    right: &[Row],
    k: usize,
    exclude_self_from: Option<i64>,
    refd: &dyn Fn(usize, usize) -> f64,
) -> Vec<String> {
    let index = CpuIndex::build(&batch(right), metric);
    let pairs = probe(
        &index,
        &batch(left),
        Selection::Nearest(k),
        ProbeOptions { exclude_self_from },
    );
    let groups = group_by_left(&pairs, left.len());
    let sim = metric.kind.is_similarity();
    let nearer = |a: f64, b: f64| if sim { a > b } else { a < b };
    let mut f = Vec::new();
    let label = format!("{metric} k={k} exclude_self={exclude_self_from:?}");
    for (i, got) in groups.iter().enumerate() {
        let Some(x) = &left[i] else {
            if !got.is_empty() {
                f.push(format!(
                    "{label}: NULL left row {i} got {} neighbours",
                    got.len()
                ));
            }
            continue;
        };
        let cand = candidates(right, i, exclude_self_from);
        if got.len() != k.min(cand.len()) {
            f.push(format!(
                "{label}: left row {i} got {} neighbours, expected {}",
                got.len(),
                k.min(cand.len())
            ));
            continue;
        }
        let mut seen = Vec::new();
        for (r, &(j, d)) in got.iter().enumerate() {
            let j = j as usize;
            if !cand.contains(&j) || seen.contains(&j) {
                f.push(format!(
                    "{label}: left row {i} got right row {j}, which is NULL, itself or repeated"
                ));
                continue;
            }
            seen.push(j);
            let y = right[j].as_ref().unwrap();
            let want = refd(i, j);
            if !tolerance_ok(metric.kind, d, want, x, y) {
                f.push(format!(
                    "{label}: ({i},{j}) distance {d:e}, reference {want:e}\n  x={}\n  y={}",
                    show(x),
                    show(y)
                ));
            }
            if r > 0 {
                let (pj, pd) = got[r - 1];
                if nearer(d, pd) || (d == pd && (j as u32) < pj) {
                    f.push(format!(
                        "{label}: left row {i}: rank {r} ({j}, {d:e}) comes after ({pj}, {pd:e})"
                    ));
                }
            }
        }
        // Nothing left out is nearer than the farthest kept one, beyond the tolerance.
        let kept: Vec<usize> = got.iter().map(|p| p.0 as usize).collect();
        let worst =
            kept.iter()
                .map(|&j| (j, refd(i, j)))
                .reduce(|a, b| if nearer(a.1, b.1) { b } else { a });
        if let Some((wj, w)) = worst {
            for &j in cand.iter().filter(|j| !kept.contains(j)) {
                let y = right[j].as_ref().unwrap();
                let rj = refd(i, j);
                let gap = slack(metric.kind, w, x, right[wj].as_ref().unwrap())
                    + slack(metric.kind, rj, x, y);
                let better = if sim { rj > w + gap } else { rj < w - gap };
                if better {
                    f.push(format!("{label}: left row {i}: right row {j} (reference {rj:e}) left out for {wj} ({w:e})"));
                }
            }
        }
        // Exact ties: of two identical right rows, the earlier one comes first.
        for (r, &j) in kept.iter().enumerate() {
            for &e in cand.iter().filter(|&&e| e < j && right[e] == right[j]) {
                match kept.iter().position(|&q| q == e) {
                    Some(re) if re < r => {}
                    _ => f.push(format!("{label}: left row {i}: right row {j} kept before its identical earlier row {e}")),
                }
            }
        }
    }
    f
}

/// Checks a radius result against reference distances; returns the failures.
fn check_radius(
    metric: &Metric,
    left: &[Row],
    right: &[Row],
    radius: f64,
    exclude_self_from: Option<i64>,
    refd: &dyn Fn(usize, usize) -> f64,
) -> Vec<String> {
    let index = CpuIndex::build(&batch(right), metric);
    let pairs = probe(
        &index,
        &batch(left),
        Selection::Within(radius),
        ProbeOptions { exclude_self_from },
    );
    let groups = group_by_left(&pairs, left.len());
    let sim = metric.kind.is_similarity();
    let mut f = Vec::new();
    let label = format!("{metric} radius={radius:e}");
    for (i, got) in groups.iter().enumerate() {
        let Some(x) = &left[i] else {
            if !got.is_empty() {
                f.push(format!("{label}: NULL left row {i} got pairs"));
            }
            continue;
        };
        if !got.windows(2).all(|w| w[0].0 < w[1].0) {
            f.push(format!(
                "{label}: left row {i}: pairs not in right row order"
            ));
        }
        let cand = candidates(right, i, exclude_self_from);
        for &(j, d) in got {
            let j = j as usize;
            if !cand.contains(&j) {
                f.push(format!(
                    "{label}: left row {i} paired with NULL/self right row {j}"
                ));
                continue;
            }
            let y = right[j].as_ref().unwrap();
            let want = refd(i, j);
            if !tolerance_ok(metric.kind, d, want, x, y) {
                f.push(format!(
                    "{label}: ({i},{j}) distance {d:e}, reference {want:e}"
                ));
            }
            if !metric.within(d, radius) {
                f.push(format!("{label}: ({i},{j}) returned with distance {d:e}"));
            }
        }
        for &j in &cand {
            let y = right[j].as_ref().unwrap();
            let want = refd(i, j);
            let s = slack(metric.kind, want, x, y);
            let clearly_in = if sim {
                want >= radius + s
            } else {
                want <= radius - s
            };
            let clearly_out = if sim {
                want < radius - s
            } else {
                want > radius + s
            };
            let returned = got.iter().any(|p| p.0 as usize == j);
            if clearly_in && !returned {
                f.push(format!(
                    "{label}: ({i},{j}) reference {want:e} is within but missing"
                ));
            }
            if clearly_out && returned {
                f.push(format!(
                    "{label}: ({i},{j}) reference {want:e} is outside but returned"
                ));
            }
        }
    }
    f
}

fn median_finite(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.filter(|d| d.is_finite()).collect();
    if v.is_empty() {
        return 1.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn knn_and_radius_match_brute_force() {
    let mut failures = Vec::new();
    for (seed, dim) in [(21u64, 32i32), (22, 2000)] {
        for metric in kind_cases(dim as u64) {
            let rows_l = rows_for(&metric, seed, 40, dim, true);
            let rows_r = rows_for(&metric, seed + 100, 90, dim, true);
            let refd = |i: usize, j: usize| {
                reference_of(
                    &metric,
                    rows_l[i].as_ref().unwrap(),
                    rows_r[j].as_ref().unwrap(),
                )
            };
            for k in [1, 7, 200] {
                failures.extend(check_knn(&metric, &rows_l, &rows_r, k, None, &refd));
            }
            let radius = median_finite(
                (0..rows_l.len())
                    .filter(|&i| rows_l[i].is_some())
                    .flat_map(|i| {
                        candidates(&rows_r, i, None)
                            .into_iter()
                            .map(move |j| (i, j))
                    })
                    .map(|(i, j)| refd(i, j)),
            );
            failures.extend(check_radius(&metric, &rows_l, &rows_r, radius, None, &refd));
        }
    }
    assert_no_failures("probe vs brute force", &failures);
}

/// Consistency of the probe with itself: the top k is the first k of the full ranking (so ties
/// at the k-th place also go to the earlier row), and a radius query returns exactly the rows of
/// the full ranking whose reported distance is within the radius.
#[test]
fn top_k_is_a_prefix_of_the_full_ranking_and_agrees_with_radius() {
    let mut failures = Vec::new();
    for (seed, dim) in [(61u64, 40i32), (62, 1500)] {
        for metric in kind_cases(dim as u64) {
            let rows_l = rows_for(&metric, seed, 30, dim, true);
            let rows_r = rows_for(&metric, seed + 100, 70, dim, true);
            let index = CpuIndex::build(&batch(&rows_r), &metric);
            let left = batch(&rows_l);
            let all = probe(
                &index,
                &left,
                Selection::Nearest(usize::MAX),
                ProbeOptions::default(),
            );
            let full = group_by_left(&all, rows_l.len());
            for k in 1..=12 {
                let top = probe(
                    &index,
                    &left,
                    Selection::Nearest(k),
                    ProbeOptions::default(),
                );
                for (i, got) in group_by_left(&top, rows_l.len()).iter().enumerate() {
                    let want = &full[i][..k.min(full[i].len())];
                    if got[..] != want[..] {
                        failures.push(format!(
                            "{metric} k={k}: left row {i} got {got:?}, the full ranking starts {want:?}"
                        ));
                    }
                }
            }
            for (i, ranking) in full.iter().enumerate() {
                for &(_, d) in ranking.iter().step_by(9) {
                    let within = probe(
                        &index,
                        &batch(&rows_l[i..=i]),
                        Selection::Within(d),
                        ProbeOptions::default(),
                    );
                    let mut want: Vec<(u32, f64)> = ranking
                        .iter()
                        .copied()
                        .filter(|p| metric.within(p.1, d))
                        .collect();
                    want.sort_by_key(|p| p.0);
                    let got: Vec<(u32, f64)> = within
                        .right
                        .iter()
                        .copied()
                        .zip(within.distance.iter().copied())
                        .collect();
                    if got != want {
                        failures.push(format!("{metric} radius={d:e}: left row {i} got {got:?}, the ranking says {want:?}"));
                    }
                }
            }
        }
    }
    assert_no_failures("probe self-consistency", &failures);
}

#[test]
fn self_join_with_exclude_self() {
    let mut failures = Vec::new();
    let dim = 300;
    for metric in kind_cases(dim as u64) {
        let rows = rows_for(&metric, 31, 60, dim, false);
        let refd = |i: usize, j: usize| {
            reference_of(
                &metric,
                rows[i].as_ref().unwrap(),
                rows[j].as_ref().unwrap(),
            )
        };
        failures.extend(check_knn(&metric, &rows, &rows, 5, Some(0), &refd));
        // A later batch of the same input: its row i is row 20 + i of the build side.
        let part: Vec<Row> = rows[20..45].to_vec();
        let refp = |i: usize, j: usize| refd(20 + i, j);
        failures.extend(check_knn(&metric, &part, &rows, 3, Some(20), &refp));
        failures.extend(check_radius(
            &metric,
            &part,
            &rows,
            median_finite(
                (0..60)
                    .filter(|&j| rows[j].is_some() && rows[20].is_some())
                    .map(|j| refd(20, j)),
            ),
            Some(20),
            &refp,
        ));
        // Without exclude_self, a row is its own nearest (distance 0), except for metrics where
        // the zero vector or a tie says otherwise; just check the result is consistent.
        failures.extend(check_knn(&metric, &part, &rows, 3, None, &refp));
    }
    assert_no_failures("self join", &failures);
}

#[test]
fn wide_index_space_uses_the_same_answers() {
    // Indices up to 2^31 - 2 make the build side use its hashed column map.
    let mut failures = Vec::new();
    let dim = i32::MAX - 1;
    for name in [
        "cosine",
        "manhattan",
        "chebyshev",
        "jaccard",
        "kl_divergence",
        "dot",
        "canberra",
    ] {
        let metric = Metric::new(name, None, None).unwrap();
        let o = GenOptions::new(50, dim)
            .nonnegative(metric.kind.needs_nonnegative())
            .max_degree(30);
        let left = random_rows(&mut rng(41), &o);
        let right = random_rows(&mut rng(42), &o);
        let refd = |i: usize, j: usize| {
            reference_of(
                &metric,
                left[i].as_ref().unwrap(),
                right[j].as_ref().unwrap(),
            )
        };
        failures.extend(check_knn(&metric, &left, &right, 4, None, &refd));
        failures.extend(check_knn(&metric, &left, &left, 4, Some(0), &|i, j| {
            reference_of(
                &metric,
                left[i].as_ref().unwrap(),
                left[j].as_ref().unwrap(),
            )
        }));
    }
    assert_no_failures("wide index space", &failures);
}

#[test]
fn ties_go_to_the_earlier_right_row_and_nulls_match_nothing() {
    let a: Row = Some(vec![(0, 1.0), (3, 2.0)]);
    let b: Row = Some(vec![(1, 1.0)]);
    let c: Row = Some(vec![(3, 2.0), (0, 1.0)]); // a, stored in another order
    let right: Vec<Row> = vec![
        b.clone(),
        a.clone(),
        None,
        a.clone(),
        c,
        a.clone(),
        Some(vec![]),
    ];
    let left: Vec<Row> = vec![a.clone(), None, Some(vec![])];
    let index = CpuIndex::build(
        &batch(&right),
        &Metric::new("euclidean", None, None).unwrap(),
    );
    let got = probe(
        &index,
        &batch(&left),
        Selection::Nearest(3),
        ProbeOptions::default(),
    );
    // Left row 0: the copies of `a` at 1, 3, 4, 5 all tie at 0; the first three by row order.
    // Left row 1 is NULL: nothing. Left row 2 (empty): the empty row 6 at 0, b (row 0) at 1,
    // then the first of the four copies of a at √5.
    assert_eq!(got.left, vec![0, 0, 0, 2, 2, 2]);
    assert_eq!(got.right, vec![1, 3, 4, 6, 0, 1]);
    assert_eq!(&got.distance[..3], &[0.0, 0.0, 0.0]);
    assert_eq!(got.ranks(), vec![1, 2, 3, 1, 2, 3]);
    // k larger than the right side: every non-NULL row once.
    let all = probe(
        &index,
        &batch(&left[..1]),
        Selection::Nearest(100),
        ProbeOptions::default(),
    );
    assert_eq!(all.right, vec![1, 3, 4, 5, 6, 0]);
    assert_eq!(all.distance[4..], [5f64.sqrt(), 6f64.sqrt()]);
    // k = 0: nothing.
    assert!(probe(
        &index,
        &batch(&left),
        Selection::Nearest(0),
        ProbeOptions::default()
    )
    .is_empty());

    // dot: a similarity, largest first, ties by row; radius means "at least".
    let q: Vec<Row> = vec![Some(vec![(0, 1.0), (1, 1.0)])];
    let r: Vec<Row> = vec![
        Some(vec![(0, 2.0)]),
        Some(vec![(0, 1.0), (1, 2.0)]),
        Some(vec![(1, 2.0)]),
        None,
        Some(vec![(0, -1.0)]),
        Some(vec![(0, 1.5), (1, 1.5)]),
    ];
    let dot = Metric::new("dot", None, None).unwrap();
    let index = CpuIndex::build(&batch(&r), &dot);
    let got = probe(
        &index,
        &batch(&q),
        Selection::Nearest(4),
        ProbeOptions::default(),
    );
    assert_eq!(got.right, vec![1, 5, 0, 2]);
    assert_eq!(got.distance, vec![3.0, 3.0, 2.0, 2.0]);
    let got = probe(
        &index,
        &batch(&q),
        Selection::Within(2.0),
        ProbeOptions::default(),
    );
    assert_eq!(got.right, vec![0, 1, 2, 5]);
    let got = probe(
        &index,
        &batch(&q),
        Selection::Within(3.0),
        ProbeOptions::default(),
    );
    assert_eq!(got.right, vec![1, 5]);
}

// ---------------------------------------------------------------------------------------------
// scipy fixtures (tests/fixtures/kos_scipy.txt, written by scripts/make_fixtures.py)
// ---------------------------------------------------------------------------------------------

struct Fixture {
    dim: u64,
    left: Vec<Row>,
    right: Vec<Row>,
    kl_left: Vec<Row>,
    kl_right: Vec<Row>,
    /// (name, matrix[left][right])
    dists: Vec<(String, Vec<Vec<f64>>)>,
}

fn parse_value(s: &str) -> f64 {
    match s {
        "inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        _ => s
            .parse()
            .unwrap_or_else(|_| panic!("bad number {s:?} in the fixture")),
    }
}

fn load_fixture() -> Fixture {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/kos_scipy.txt");
    let text = std::fs::read_to_string(path).expect("fixture file");
    let mut fx = Fixture {
        dim: 0,
        left: vec![],
        right: vec![],
        kl_left: vec![],
        kl_right: vec![],
        dists: vec![],
    };
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let mut it = line.split(' ');
        let tag = it.next().unwrap();
        let row = |it: std::str::Split<'_, char>| -> Row {
            Some(
                it.map(|e| {
                    let (i, v) = e.split_once(':').expect("idx:val");
                    (i.parse().unwrap(), v.parse().unwrap())
                })
                .collect(),
            )
        };
        match tag {
            "dim" => fx.dim = it.next().unwrap().parse().unwrap(),
            "L" | "R" | "KL_L" | "KL_R" => {
                let n: usize = it.next().unwrap().parse().unwrap();
                let target = match tag {
                    "L" => &mut fx.left,
                    "R" => &mut fx.right,
                    "KL_L" => &mut fx.kl_left,
                    _ => &mut fx.kl_right,
                };
                assert_eq!(target.len(), n, "rows in order");
                target.push(row(it));
            }
            "D" => {
                let name = it.next().unwrap().to_string();
                let i: usize = it.next().unwrap().parse().unwrap();
                let values: Vec<f64> = it.map(parse_value).collect();
                if fx.dists.last().is_none_or(|d| d.0 != name) {
                    fx.dists.push((name.clone(), Vec::new()));
                }
                let m = &mut fx.dists.last_mut().unwrap().1;
                assert_eq!(m.len(), i);
                m.push(values);
            }
            other => panic!("unknown fixture line tag {other}"),
        }
    }
    fx
}

/// l1-normalised in float32 exactly as the fixture script does.
fn l1(rows: &[Row]) -> Vec<Row> {
    rows.iter()
        .map(|r| {
            r.as_ref().map(|r| {
                let s: f64 = r.iter().map(|e| e.1 as f64).sum();
                r.iter().map(|&(i, v)| (i, (v as f64 / s) as f32)).collect()
            })
        })
        .collect()
}

#[test]
fn scipy_figures_for_kos_rows() {
    let fx = load_fixture();
    assert_eq!((fx.left.len(), fx.right.len(), fx.dim), (20, 20, 6906));
    let (pl, pr) = (l1(&fx.left), l1(&fx.right));
    let mut failures = Vec::new();
    let mut names = Vec::new();
    for (name, matrix) in &fx.dists {
        let (metric, left, right) = match name.as_str() {
            "minkowski_1.5" => (m("minkowski", Some(1.5), None), &fx.left, &fx.right),
            "minkowski_3" => (m("minkowski", Some(3.0), None), &fx.left, &fx.right),
            "jensenshannon" | "hellinger" | "kl_divergence" => (m(name, None, None), &pl, &pr),
            "kl_smoothed" => (m("kl", None, None), &fx.kl_left, &fx.kl_right),
            other => {
                let kind: MetricKind = other.parse().unwrap();
                (
                    m(other, None, kind.needs_dim().then_some(fx.dim)),
                    &fx.left,
                    &fx.right,
                )
            }
        };
        names.push(metric.kind);
        let scipy = |i: usize, j: usize| matrix[i][j];
        for (i, x) in left.iter().enumerate() {
            let x = x.as_ref().unwrap();
            for (j, y) in right.iter().enumerate() {
                let y = y.as_ref().unwrap();
                let want = scipy(i, j);
                let got = metric.distance((&idx(x), &val(x)), (&idx(y), &val(y)));
                if !tolerance_ok(metric.kind, got, want, x, y) {
                    failures.push(format!(
                        "{name} ({i},{j}): Metric::distance {got:e}, scipy {want:e}"
                    ));
                }
                // The plain reference agrees with scipy too (so it is a fair judge elsewhere).
                let r = reference_of(&metric, x, y);
                if !tolerance_ok(metric.kind, r, want, x, y) {
                    failures.push(format!("{name} ({i},{j}): reference {r:e}, scipy {want:e}"));
                }
            }
        }
        for k in [5, 20] {
            failures.extend(
                check_knn(&metric, left, right, k, None, &scipy)
                    .into_iter()
                    .map(|e| format!("{name}: {e}")),
            );
        }
    }
    for kind in MetricKind::all() {
        assert!(
            names.contains(&kind),
            "the fixture has no figures for {kind}"
        );
    }
    assert_no_failures("scipy fixtures", &failures);
}

/// Near-duplicate documents with large values: the case where a folded (expanded) form
/// cancels. Each base row has 30 values in [1e4, 1e5); its copies move every value by a
/// relative 1e-6 and list the entries in another order.
fn near_duplicates() -> Vec<Row> {
    let mut r = rng(51);
    let dim = 400;
    let mut rows: Vec<Row> = Vec::new();
    for _ in 0..6 {
        let mut base: Entries = Vec::new();
        while base.len() < 30 {
            let i = rand::Rng::random_range(&mut r, 0..dim);
            if !base.iter().any(|e| e.0 == i) {
                base.push((i, rand::Rng::random_range(&mut r, 1e4..1e5) as f32));
            }
        }
        rows.push(Some(base.clone()));
        for _ in 0..3 {
            let mut copy: Entries = base
                .iter()
                .map(|&(i, v)| {
                    (
                        i,
                        (v as f64 * (1.0 + 1e-6 * rand::Rng::random_range(&mut r, -1.0..1.0)))
                            as f32,
                    )
                })
                .collect();
            rand::seq::SliceRandom::shuffle(&mut copy[..], &mut r);
            rows.push(Some(copy));
        }
    }
    rows
}

#[test]
fn near_duplicate_rows_with_large_values() {
    let rows = near_duplicates();
    let mut failures = Vec::new();
    for (name, metric) in metric_cases(400) {
        check_distance_row_by_row(&metric, &name, &rows, &mut failures);
    }
    for metric in kind_cases(400)
        .into_iter()
        .filter(|m| m.kind != MetricKind::Minkowski)
    {
        let refd = |i: usize, j: usize| {
            reference_of(
                &metric,
                rows[i].as_ref().unwrap(),
                rows[j].as_ref().unwrap(),
            )
        };
        failures.extend(check_knn(&metric, &rows, &rows, 4, Some(0), &refd));
    }
    assert_no_failures("near duplicates with large values", &failures);
}

/// The folded form Σ|x|ᵖ + Σ|y|ᵖ + Σ_shared(|x−y|ᵖ − |x|ᵖ − |y|ᵖ) cancels on these rows (p = 3:
/// 0 or 2.0 where the reference is about 0.15); the probe must refine minkowski candidates exactly.
#[test]
fn minkowski_probe_on_near_duplicate_rows_with_large_values() {
    let rows = near_duplicates();
    let mut failures = Vec::new();
    for p in [1.5, 2.0, 3.0] {
        let metric = Metric::new("minkowski", Some(p), None).unwrap();
        let refd = |i: usize, j: usize| {
            reference_of(
                &metric,
                rows[i].as_ref().unwrap(),
                rows[j].as_ref().unwrap(),
            )
        };
        failures.extend(check_knn(&metric, &rows, &rows, 4, Some(0), &refd));
    }
    assert_no_failures(
        "minkowski probe, near duplicates with large values",
        &failures,
    );
}
