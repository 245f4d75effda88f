//! The `sparse-knn` binary end to end: `cargo test --release --test cli`.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Float64Type, Int32Type, Int64Type};
use datafusion_sparse_knn::generate::Shape;
use datafusion_sparse_knn::vector::VectorCheck;
use datafusion_sparse_knn::{Metric, SparseBatch};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sparse-knn"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("the binary runs")
}

fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Exit 1 and exactly one line on stderr; returns that line.
fn fails(args: &[&str]) -> String {
    let out = run(args);
    assert_eq!(out.status.code(), Some(1), "{args:?} should fail with 1");
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line on stderr, got: {err}"
    );
    err
}

fn generate(dir: &Path, name: &str, shape: &str, rows: usize, seed: u64) -> PathBuf {
    let path = dir.join(name);
    ok(&[
        "generate",
        "--shape",
        shape,
        "--rows",
        &rows.to_string(),
        "--seed",
        &seed.to_string(),
        "--output",
        path.to_str().unwrap(),
    ]);
    path
}

fn read(path: &Path) -> Vec<RecordBatch> {
    ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

fn vectors(path: &Path) -> SparseBatch {
    let batches: Vec<SparseBatch> = read(path)
        .iter()
        .map(|b| {
            let col = b.schema().index_of("vec").unwrap();
            SparseBatch::try_from_array(b.column(col), &VectorCheck::new("vec")).unwrap()
        })
        .collect();
    SparseBatch::concat(&batches).unwrap()
}

#[test]
fn sql_prints_each_format() {
    let q = "SELECT 1 AS a, 'x,y' AS b; SELECT sparse_nnz(sparse_vector([3, 1], [0.5, 2.0])) AS n";
    let table = ok(&["sql", "-c", q]);
    assert!(
        table.contains("| a | b   |") && table.contains("| 1 | x,y |"),
        "{table}"
    );
    assert!(
        table.contains("| n |") && table.contains("| 2 |"),
        "{table}"
    );
    let csv = ok(&["sql", "--format", "csv", "-c", q]);
    assert_eq!(csv, "a,b\n1,\"x,y\"\nn\n2\n");
    let json = ok(&["sql", "--format", "json", "-c", q]);
    assert_eq!(json, "{\"a\":1,\"b\":\"x,y\"}\n{\"n\":2}\n");
    // Vectors print in CSV as text and in JSON as objects.
    let v = "SELECT sparse_vector([1, 2], [0.5, 1.0]) AS v";
    assert!(ok(&["sql", "--format", "csv", "-c", v]).contains("indices: [1, 2]"));
    assert!(ok(&["sql", "--format", "json", "-c", v])
        .contains("{\"v\":{\"indices\":[1,2],\"values\":[0.5,1.0]}}"));
}

#[test]
fn sql_reads_standard_input_with_comments() {
    let mut child = bin()
        .args(["sql", "--format", "csv"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"-- a comment; with a semicolon\nCREATE TABLE t AS VALUES (1), (2), (3);\n/* block */ SELECT sum(column1) AS s FROM t;\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "s\n6\n");
}

#[test]
fn sql_registers_tables_and_runs_files() {
    let dir = tempfile::tempdir().unwrap();
    let data = generate(dir.path(), "ml.parquet", "movielens", 500, 1);
    let script = dir.path().join("q.sql");
    std::fs::write(
        &script,
        "SELECT count(*) AS c, min(id) AS lo, max(id) AS hi FROM ml;",
    )
    .unwrap();
    let out = ok(&[
        "sql",
        "--format",
        "csv",
        "--table",
        &format!("ml={}", data.display()),
        script.to_str().unwrap(),
    ]);
    assert_eq!(out, "c,lo,hi\n500,0,499\n");
    // A folder of Parquet files is one table.
    let folder = dir.path().join("parts");
    std::fs::create_dir(&folder).unwrap();
    generate(&folder, "a.parquet", "secedgar", 100, 1);
    generate(&folder, "b.parquet", "secedgar", 50, 2);
    let out = ok(&[
        "sql",
        "--format",
        "csv",
        "--table",
        &format!("s={}", folder.display()),
        "-c",
        "SELECT count(*) AS c FROM s",
    ]);
    assert_eq!(out, "c\n150\n");
}

#[test]
fn errors_are_one_line_and_exit_1() {
    let e = fails(&["sql", "-c", "SELECT * FROM no_such_table"]);
    assert!(e.contains("no_such_table"), "{e}");
    let e = fails(&["sql", "-c", "SELEC 1"]);
    assert!(e.starts_with("sparse-knn: "), "{e}");
    fails(&[
        "sql",
        "--table",
        "t=/no/such/file.parquet",
        "-c",
        "SELECT 1",
    ]);
    fails(&[
        "generate",
        "--shape",
        "imagenet",
        "--output",
        "/tmp/never-written.parquet",
    ]);
    assert!(!Path::new("/tmp/never-written.parquet").exists());
    // Statements before the error ran and printed; the exit code still says it failed.
    let out = run(&[
        "sql",
        "--format",
        "csv",
        "-c",
        "SELECT 1 AS a; SELECT nope()",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "a\n1\n");
}

#[test]
fn generate_is_deterministic_per_seed() {
    let dir = tempfile::tempdir().unwrap();
    let a = generate(dir.path(), "a.parquet", "nytimes", 9000, 7);
    let b = generate(dir.path(), "b.parquet", "nytimes", 9000, 7);
    let c = generate(dir.path(), "c.parquet", "nytimes", 9000, 8);
    let (va, vb, vc) = (vectors(&a), vectors(&b), vectors(&c));
    assert_eq!(va.offsets(), vb.offsets());
    assert_eq!(va.indices(), vb.indices());
    assert_eq!(va.values(), vb.values());
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert_ne!(va.indices(), vc.indices());
    // The library's generator gives the same rows as the file.
    let lib: Vec<RecordBatch> =
        datafusion_sparse_knn::generate::generate(Shape::NyTimes, Some(9000), 7)
            .unwrap()
            .collect();
    let from_lib = SparseBatch::concat(
        &lib.iter()
            .map(|b| SparseBatch::try_from_array(b.column(1), &VectorCheck::new("vec")).unwrap())
            .collect::<Vec<_>>(),
    )
    .unwrap();
    assert_eq!(from_lib.indices(), va.indices());
}

#[test]
fn generate_has_the_shapes_statistics() {
    let dir = tempfile::tempdir().unwrap();
    // (shape, rows, min degree, max degree, mean degree of the paper's density, columns)
    let cases = [
        ("movielens", 3000, 0, 24_000, 97.0, 194_000),
        ("nytimes", 3000, 0, 2000, 204.0, 102_000),
        ("scrna", 400, 501, 9600, 1820.0, 26_000),
        ("secedgar", 20_000, 0, 51, 6.0, 858_000),
    ];
    for (shape, rows, min, max, mean, cols) in cases {
        let path = generate(dir.path(), &format!("{shape}.parquet"), shape, rows, 11);
        let batches = read(&path);
        assert_eq!(batches[0].schema().field(0).name(), "id");
        let ids: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        assert_eq!(ids, (0..rows as i64).collect::<Vec<_>>());
        let v = vectors(&path);
        assert_eq!(v.len(), rows);
        let degrees: Vec<usize> = (0..rows).map(|r| v.row_len(r)).collect();
        let lo = *degrees.iter().min().unwrap();
        let hi = *degrees.iter().max().unwrap();
        assert!(
            lo >= min && hi <= max,
            "{shape}: degrees {lo}..{hi} outside {min}..{max}"
        );
        let m = v.nnz() as f64 / rows as f64;
        assert!(
            (m / mean - 1.0).abs() < 0.25,
            "{shape}: mean degree {m}, paper {mean}"
        );
        assert!(v.max_dim() <= cols, "{shape}: index beyond {cols}");
        assert!(
            v.values().iter().all(|&x| x > 0.0),
            "{shape}: values must be positive"
        );
        // Popular but not universal: the top column is in roughly half of the rows.
        let mut count = vec![0usize; cols];
        v.indices().iter().for_each(|&i| count[i as usize] += 1);
        let top = *count.iter().max().unwrap() as f64 / rows as f64;
        assert!(
            (0.25..0.8).contains(&top),
            "{shape}: top column in {top} of rows"
        );
        for r in 0..rows {
            let (idx, _) = v.row(r);
            assert!(
                idx.windows(2).all(|w| w[0] < w[1]),
                "{shape}: row {r} not sorted"
            );
        }
    }
}

#[test]
fn output_is_never_overwritten_by_surprise() {
    let dir = tempfile::tempdir().unwrap();
    let path = generate(dir.path(), "x.parquet", "secedgar", 100, 1);
    let before = std::fs::read(&path).unwrap();
    let p = path.to_str().unwrap();
    let e = fails(&[
        "generate", "--shape", "secedgar", "--rows", "100", "--seed", "2", "--output", p,
    ]);
    assert!(e.contains("--overwrite"), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let e = fails(&[
        "knn", "--left", p, "--right", p, "--metric", "cosine", "-k", "3", "--output", p,
    ]);
    assert!(e.contains("exists"), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    ok(&[
        "generate",
        "--shape",
        "secedgar",
        "--rows",
        "100",
        "--seed",
        "2",
        "--output",
        p,
        "--overwrite",
    ]);
    assert_ne!(std::fs::read(&path).unwrap(), before);
    // No temporary file is left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// `knn` output against brute force with `Metric::distance`: per query the k smallest distances,
/// ranks 1..k, and neighbours that really are at the reported distance.
fn check_knn(dir: &Path, left: &Path, right: &Path, metric: &str, k: usize, exclude_self: bool) {
    let out = dir.join(format!("knn_{metric}.parquet"));
    let k_text = k.to_string();
    let mut args = vec![
        "knn",
        "--left",
        left.to_str().unwrap(),
        "--right",
        right.to_str().unwrap(),
        "--metric",
        metric,
        "-k",
        &k_text,
        "--output",
        out.to_str().unwrap(),
        "--device",
        "cpu",
    ];
    if exclude_self {
        args.push("--exclude-self");
    }
    let run_out = run(&args);
    assert!(
        run_out.status.success(),
        "{}",
        String::from_utf8_lossy(&run_out.stderr)
    );
    let summary = String::from_utf8(run_out.stderr).unwrap();
    assert!(
        summary.contains("pairs") && summary.contains("device cpu"),
        "{summary}"
    );

    let (l, r) = (vectors(left), vectors(right));
    let m = Metric::new(metric, None, None).unwrap();
    let mut got: Vec<Vec<(i32, i64, f64)>> = vec![Vec::new(); l.len()];
    for b in read(&out) {
        let q = b
            .column(b.schema().index_of("query_id").unwrap())
            .as_primitive::<Int64Type>()
            .clone();
        let n = b
            .column(b.schema().index_of("neighbor_id").unwrap())
            .as_primitive::<Int64Type>()
            .clone();
        let d = b
            .column(b.schema().index_of("distance").unwrap())
            .as_primitive::<Float64Type>()
            .clone();
        let rank = b
            .column(b.schema().index_of("rank").unwrap())
            .as_primitive::<Int32Type>()
            .clone();
        for i in 0..b.num_rows() {
            got[q.value(i) as usize].push((rank.value(i), n.value(i), d.value(i)));
        }
    }
    for (qi, mut pairs) in got.into_iter().enumerate() {
        pairs.sort_by_key(|p| p.0);
        let mut expected: Vec<f64> = (0..r.len())
            .filter(|&j| !(exclude_self && j == qi))
            .map(|j| m.distance(l.row(qi), r.row(j)))
            .collect();
        expected.sort_by(|a, b| a.partial_cmp(b).unwrap());
        expected.truncate(k);
        assert_eq!(pairs.len(), expected.len(), "query {qi}");
        for (i, ((rank, neighbor, d), e)) in pairs.iter().zip(&expected).enumerate() {
            assert_eq!(*rank as usize, i + 1, "query {qi}");
            assert!(
                (d - e).abs() <= 1e-4 * e.abs().max(1.0),
                "query {qi} rank {rank}: {d} vs {e}"
            );
            let again = m.distance(l.row(qi), r.row(*neighbor as usize));
            assert!(
                (d - again).abs() <= 1e-4 * again.abs().max(1.0),
                "query {qi}: neighbour {neighbor}"
            );
            assert!(!(exclude_self && *neighbor as usize == qi));
        }
    }
}

#[test]
fn knn_round_trip_matches_brute_force() {
    let dir = tempfile::tempdir().unwrap();
    let data = generate(dir.path(), "data.parquet", "movielens", 400, 5);
    check_knn(dir.path(), &data, &data, "cosine", 5, true);
    let queries = generate(dir.path(), "q.parquet", "movielens", 60, 6);
    check_knn(dir.path(), &queries, &data, "manhattan", 4, false);
}

#[test]
fn sql_examples_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if !root.join("../shared/data/kos_bow.parquet").exists() {
        eprintln!("skipped: ../shared/data is not here");
        return;
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("sql-examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 4,
        "expected the bundled examples, found {files:?}"
    );
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(
            text.starts_with("--"),
            "{} should begin with a comment",
            f.display()
        );
        let rel = f.strip_prefix(root).unwrap();
        let out = ok(&["sql", rel.to_str().unwrap()]);
        assert!(out.lines().count() >= 5, "{}: {out}", f.display());
    }
}

#[test]
fn bench_times_each_metric_and_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let out = ok(&[
        "bench",
        "--shape",
        "secedgar",
        "--rows",
        "3000",
        "--queries",
        "200",
        "-k",
        "5",
        "--metrics",
        "cosine,hamming",
        "--devices",
        "cpu",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.contains("metric cosine") && out.contains("metric hamming"),
        "{out}"
    );
    let text = std::fs::read_to_string(&json).unwrap();
    // 200 queries x k = 5 neighbours each, for both metrics; a projection since Q < rows.
    assert_eq!(text.matches("\"pairs\": 1000,").count(), 2, "{text}");
    assert_eq!(text.matches("\"error\": null").count(), 2, "{text}");
    assert!(!text.contains("\"projected_full_join_s\": null"), "{text}");
    // --json is not overwritten by surprise either.
    let e = fails(&["bench", "--rows", "100", "--json", json.to_str().unwrap()]);
    assert!(e.contains("--overwrite"), "{e}");
    if !datafusion_sparse_knn::gpu::is_available() {
        let e = fails(&[
            "bench",
            "--shape",
            "secedgar",
            "--rows",
            "100",
            "--metrics",
            "cosine",
            "--devices",
            "gpu",
        ]);
        assert!(e.contains("1 of 1 runs failed") && e.contains("gpu"), "{e}");
    }
}
