//! CPU backend benchmark: `CpuIndex::build` + `probe` for Q queries (the first Q rows) against all
//! rows of a Parquet file's sparse-vector column, k nearest (or, with `--radius R`, every pair
//! within R: `Selection::Within`, for `dot` a value of at least R), every metric.
//!
//! ```text
//! cargo bench --bench cpu_knn -- --parquet /tmp/powerlaw_2m.parquet -q 2000 --json ours.json
//! cargo bench --bench cpu_knn -- --parquet /tmp/powerlaw_2m.parquet -q 2000 --metrics cosine \
//!     --radius 0.5 --check 50 --json ours_radius.json
//! ```
//! The anchors (scikit-learn, sparse_dot_topn) come from `bench/cpu_anchors.py` on the same file;
//! `bench/bench.sh run cpu` runs both and writes the comparison.

use std::fs::File;
use std::io::Write;
use std::time::Instant;

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::DataType;
use clap::Parser;
use datafusion_sparse_knn::cpu::{probe_parts, CpuIndex, PairList, ProbeOptions, Selection};
use datafusion_sparse_knn::metric::{Metric, MetricKind};
use datafusion_sparse_knn::vector::VectorCheck;
use datafusion_sparse_knn::SparseBatch;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

#[derive(Parser, Debug)]
struct Args {
    /// Parquet file with one sparse-vector column.
    #[arg(long)]
    parquet: String,
    /// The vector column (default: the first struct column).
    #[arg(long)]
    column: Option<String>,
    /// Queries: the first Q rows.
    #[arg(short, long, default_value_t = 2000)]
    queries: usize,
    #[arg(short, default_value_t = 10)]
    k: usize,
    /// Radius join instead of k nearest: every pair at distance ≤ R (for `dot`: ≥ R).
    #[arg(long)]
    radius: Option<f64>,
    /// Comma-separated metrics, or `all`; `minkowski:P` for a degree P other than 2.
    #[arg(long, default_value = "all")]
    metrics: String,
    /// Best of this many runs (a run over 10 s is not repeated).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Check this many queries' neighbours (or, with `--radius`, pairs) against
    /// `Metric::distance` brute force.
    #[arg(long, default_value_t = 0)]
    check: usize,
    /// Print a digest of each metric's pairs (left row, right row and distance bits, in order), to
    /// compare two builds' answers bit for bit.
    #[arg(long)]
    digest: bool,
    /// Write the results here as JSON.
    #[arg(long)]
    json: Option<String>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn read_column(path: &str, column: Option<&str>) -> ArrayRef {
    let file = File::open(path).unwrap_or_else(|e| panic!("cannot open {path}: {e}"));
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let batches: Vec<_> = reader.map(|b| b.unwrap()).collect();
    let schema = batches[0].schema();
    let idx = match column {
        Some(c) => schema.index_of(c).unwrap(),
        None => schema
            .fields()
            .iter()
            .position(|f| matches!(f.data_type(), DataType::Struct(_)))
            .expect("a struct column"),
    };
    let parts: Vec<&dyn Array> = batches.iter().map(|b| b.column(idx).as_ref()).collect();
    arrow::compute::concat(&parts).unwrap()
}

/// Brute force with the row-by-row definition, for `--check`.
fn check(
    metric: &Metric,
    right: &SparseBatch,
    left: &SparseBatch,
    got: &PairList,
    k: usize,
    n: usize,
) {
    let mut worst = 0.0f64;
    for q in 0..n.min(left.len()) {
        let mut all: Vec<(f64, u32)> = (0..right.len())
            .map(|j| {
                let d = metric.distance(left.row(q), right.row(j));
                (if metric.kind.is_similarity() { -d } else { d }, j as u32)
            })
            .collect();
        all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let want: Vec<f64> = all[..k.min(all.len())]
            .iter()
            .map(|e| {
                if metric.kind.is_similarity() {
                    -e.0
                } else {
                    e.0
                }
            })
            .collect();
        let have: Vec<f64> = (0..got.len())
            .filter(|&i| got.left[i] == q as u32)
            .map(|i| got.distance[i])
            .collect();
        assert_eq!(
            want.len(),
            have.len(),
            "{metric}: query {q} has {} neighbours",
            have.len()
        );
        for (w, h) in want.iter().zip(&have) {
            if w.is_infinite() && w == h {
                continue;
            }
            let err = (w - h).abs() / w.abs().max(1.0);
            worst = worst.max(err);
            assert!(
                err <= 1e-4,
                "{metric}: query {q}: want {want:?}, have {have:?}"
            );
        }
    }
    println!("    check: {n} queries, worst relative error {worst:.1e}");
}

/// Brute force for `--radius`: the same set of pairs as `Metric::distance` row by row, distances
/// within 1e-4·max(1, |d|). A pair that only one side keeps must lie at the boundary (its distance
/// within that tolerance of the radius): such pairs are counted, not failed.
fn check_radius(
    metric: &Metric,
    right: &SparseBatch,
    left: &SparseBatch,
    got: &PairList,
    radius: f64,
    n: usize,
) {
    let n = n.min(left.len());
    let tol = |d: f64| 1e-4 * d.abs().max(1.0);
    let mut have: Vec<Vec<(u32, f64)>> = vec![Vec::new(); n];
    for i in 0..got.len() {
        if (got.left[i] as usize) < n {
            have[got.left[i] as usize].push((got.right[i], got.distance[i]));
        }
    }
    let (mut worst, mut boundary, mut pairs) = (0.0f64, 0usize, 0usize);
    for (q, have) in have.iter_mut().enumerate() {
        have.sort_by_key(|e| e.0);
        for w in have.windows(2) {
            assert!(
                w[0].0 != w[1].0,
                "{metric}: query {q}: right row {} twice",
                w[0].0
            );
        }
        let mut it = have.iter().peekable();
        for j in 0..right.len() {
            let d = metric.distance(left.row(q), right.row(j));
            let want = metric.within(d, radius);
            let h = it.next_if(|e| e.0 == j as u32).map(|e| e.1);
            match (want, h) {
                (true, Some(h)) => {
                    pairs += 1;
                    if !(d.is_infinite() && d == h) {
                        let err = (d - h).abs() / d.abs().max(1.0);
                        worst = worst.max(err);
                        assert!(
                            err <= 1e-4,
                            "{metric}: query {q}, right row {j}: want {d}, have {h}"
                        );
                    }
                }
                (false, None) => {}
                (_, h) => {
                    assert!(
                        (d - radius).abs() <= tol(radius),
                        "{metric}: query {q}, right row {j} at {d} (radius {radius}): {}",
                        match h {
                            Some(h) => format!("kept at {h}, brute force drops it"),
                            None => "missing".to_string(),
                        }
                    );
                    boundary += 1;
                }
            }
        }
    }
    println!(
        "    check: {n} queries, {pairs} pairs, worst relative error {worst:.1e}, \
         {boundary} pairs at the boundary kept by one side only"
    );
}

/// FNV-1a over every pair's left row, right row and distance bits, in order.
fn digest(pairs: &PairList) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |x: u64| {
        for b in x.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    };
    for i in 0..pairs.len() {
        eat(pairs.left[i] as u64);
        eat(pairs.right[i] as u64);
        eat(pairs.distance[i].to_bits());
    }
    h
}

fn main() {
    let args = Args::parse();
    let array = read_column(&args.parquet, args.column.as_deref());
    let right = SparseBatch::try_from_array(array.as_ref(), &VectorCheck::new("vec")).unwrap();
    let q = args.queries.min(right.len());
    let left =
        SparseBatch::try_from_array(array.slice(0, q).as_ref(), &VectorCheck::new("vec")).unwrap();
    let dim = right.max_dim() as u64;
    let threads = rayon::current_num_threads();
    let (selection, mode) = match args.radius {
        Some(r) => (Selection::Within(r), format!("radius={r}")),
        None => (Selection::Nearest(args.k), format!("k={}", args.k)),
    };
    println!(
        "{}: {} rows, nnz {}, dim {dim}; {q} queries, {mode}, {threads} threads",
        args.parquet,
        right.len(),
        right.nnz(),
    );

    let kinds: Vec<(MetricKind, Option<f64>)> = if args.metrics == "all" {
        MetricKind::all().map(|k| (k, None)).collect()
    } else {
        args.metrics
            .split(',')
            .map(|m| match m.split_once(':') {
                Some((name, p)) => (name.parse().unwrap(), Some(p.parse().unwrap())),
                None => (m.parse().unwrap(), None),
            })
            .collect()
    };
    println!(
        "{:<14} {:>9} {:>9} {:>9} {:>11} {:>12}",
        "metric", "build_s", "probe_s", "total_s", "index_MiB", "pairs"
    );
    let mut json = Vec::new();
    for (kind, p) in kinds {
        let metric = Metric::from_kind(kind, p, Some(dim)).unwrap();
        let name = match p {
            Some(p) => format!("{}:{p}", kind.name()),
            None => kind.name().to_string(),
        };
        let (mut build_s, mut probe_s) = (f64::INFINITY, f64::INFINITY);
        let mut index_bytes = 0;
        let mut pairs = PairList::default();
        for _ in 0..args.repeat {
            let t = Instant::now();
            let index = CpuIndex::build(&right, &metric);
            let b = t.elapsed().as_secs_f64();
            let t = Instant::now();
            // The pairs as the operator takes them (its record batches), not joined into one.
            let parts = probe_parts(&index, &left, selection, ProbeOptions::default());
            let p = t.elapsed().as_secs_f64();
            // Joined for the checks below, outside the timing.
            pairs = PairList::concat(parts);
            index_bytes = index.memory_size();
            if b + p < build_s + probe_s {
                (build_s, probe_s) = (b, p);
            }
            // A slow metric's run-to-run noise is small next to it: one run is enough.
            if b + p > 10.0 {
                break;
            }
        }
        if args.radius.is_none() {
            assert_eq!(pairs.len(), q * args.k.min(right.len()));
        }
        println!(
            "{:<14} {build_s:>9.3} {probe_s:>9.3} {:>9.3} {:>11.1} {:>12}",
            name,
            build_s + probe_s,
            index_bytes as f64 / (1 << 20) as f64,
            pairs.len()
        );
        if args.digest {
            println!("    digest: {:016x}", digest(&pairs));
        }
        if args.check > 0 {
            match args.radius {
                Some(r) => check_radius(&metric, &right, &left, &pairs, r, args.check),
                None => check(&metric, &right, &left, &pairs, args.k, args.check),
            }
        }
        json.push(format!(
            "{{\"metric\": \"{}\", \"build_s\": {build_s}, \"probe_s\": {probe_s}, \"seconds\": {}, \"index_bytes\": {index_bytes}, \"pairs\": {}}}",
            name,
            build_s + probe_s,
            pairs.len()
        ));
    }
    if let Some(path) = &args.json {
        let mut f = File::create(path).unwrap();
        writeln!(
            f,
            "{{\"parquet\": \"{}\", \"rows\": {}, \"nnz\": {}, \"queries\": {q}, \"k\": {}, \"radius\": {}, \"threads\": {threads}, \"results\": [\n{}\n]}}",
            args.parquet,
            right.len(),
            right.nnz(),
            args.k,
            args.radius.map_or("null".to_string(), |r| r.to_string()),
            json.join(",\n")
        )
        .unwrap();
    }
}
