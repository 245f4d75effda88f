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

/// The binary, run from the crate's folder where there is one.
fn bin() -> Command {
    let mut c = Command::new(crate::common::sparse_knn_bin());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if root.is_dir() {
        c.current_dir(root);
    }
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

/// `knn --profile` accounts for the job's time: its phases in order, and the join operator's own
/// metrics (rows built, the right side's read and build time), which only a run that really
/// went through the operator can give.
#[test]
fn knn_profile_shows_the_phases_and_the_operators_metrics() {
    knn_profile_shows_the_phases_and_the_operators_metrics_on("cpu");
}

/// On the GPU the profile also says that the GPU was closed beside the output's commit: the
/// join's index (held by the plan that the profile reads) was dropped before, not at the exit.
#[test]
#[ignore = "needs a CUDA GPU"]
fn knn_profile_shows_the_phases_and_the_operators_metrics_on_the_gpu() {
    knn_profile_shows_the_phases_and_the_operators_metrics_on("gpu");
}

fn knn_profile_shows_the_phases_and_the_operators_metrics_on(device: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = generate(dir.path(), "p.parquet", "nytimes", 300, 4);
    let (p, out) = (path.to_str().unwrap(), dir.path().join("nn.parquet"));
    let o = out.to_str().unwrap();
    let job = |profile: bool| {
        let mut args = vec![
            "knn",
            "--left",
            p,
            "--right",
            p,
            "--metric",
            "cosine",
            "-k",
            "3",
            "--device",
            device,
            "--output",
            o,
            "--overwrite",
        ];
        if profile {
            args.push("--profile");
        }
        run(&args)
    };
    let run = job(true);
    assert!(run.status.success());
    let err = String::from_utf8(run.stderr).unwrap();
    let seconds = |label: &str| -> f64 {
        let line = err
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no '{label}' line in: {err}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (first, last, total) = (
        seconds("first pairs"),
        seconds("last pairs"),
        seconds("total"),
    );
    assert!(first > 0.0 && first <= last && last <= total, "{err}");
    assert!(seconds("of which waiting on the join") <= last, "{err}");
    let join = err
        .lines()
        .find(|l| {
            l.trim_start()
                .starts_with(&format!("KnnJoinExec: metric=cosine, k=3, device={device}"))
        })
        .unwrap_or_else(|| panic!("no operator line in: {err}"));
    let closed = err
        .lines()
        .find(|l| l.contains("closed beside the commit"))
        .map(|l| {
            l.trim_start()
                .split(' ')
                .next()
                .unwrap()
                .parse::<usize>()
                .unwrap()
        });
    if device == "gpu" {
        assert!(closed.is_some_and(|n| n >= 1), "{err}");
    } else {
        assert_eq!(closed, None, "{err}");
    }
    for metric in [
        "build_rows=300,",
        "pairs=900,",
        "build_read_time=",
        "build_time=",
    ] {
        assert!(join.contains(metric), "{metric} not in {join}");
    }
    // Without the flag, only the summary line.
    let plain = job(false);
    assert!(plain.status.success());
    let quiet = String::from_utf8(plain.stderr).unwrap();
    assert_eq!(quiet.trim_end().lines().count(), 1, "{quiet}");
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

/// The query results of one `--format csv` run, split at the header lines the caller expects
/// (one per query, in order): for each query, its rows as fields.
fn csv_results(out: &str, headers: &[&str]) -> Vec<Vec<Vec<String>>> {
    let mut results: Vec<Vec<Vec<String>>> = Vec::new();
    let mut next = headers.iter().peekable();
    for line in out.lines() {
        if next.peek().is_some_and(|h| **h == line) {
            next.next();
            results.push(Vec::new());
            continue;
        }
        let rows = results
            .last_mut()
            .unwrap_or_else(|| panic!("output before the first header: {line}"));
        rows.push(line.split(',').map(str::to_string).collect());
    }
    assert!(
        next.peek().is_none(),
        "missing the header {:?} in:\n{out}",
        next.peek()
    );
    results
}

fn num(field: &str) -> f64 {
    field
        .parse()
        .unwrap_or_else(|_| panic!("'{field}' is not a number"))
}

/// Every file of sql-examples/ runs on the bundled data (no skip: data/ is part of the
/// repository) and gives the results its comments describe.
#[test]
fn sql_examples_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<String> = std::fs::read_dir(root.join("sql-examples"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sql"))
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "01_document_similarity.sql",
            "02_knn_graph.sql",
            "03_string_matching.sql",
            "04_jensen_shannon.sql",
            "05_news20_classification.sql",
            "06_within_newsgroup.sql"
        ],
        "a new example needs its checks here"
    );
    for f in &files {
        let text = std::fs::read_to_string(root.join("sql-examples").join(f)).unwrap();
        assert!(text.starts_with("--"), "{f} should begin with a comment");
        assert!(
            !text.contains("../"),
            "{f} reads a file outside the repository"
        );
    }
    let example = |name: &str, headers: &[&str]| {
        let path = format!("sql-examples/{name}");
        csv_results(&ok(&["sql", "--format", "csv", &path]), headers)
    };

    // Five queries, five neighbours each (itself left out), nearest first, cosine in [0, 1].
    let r = example(
        "01_document_similarity.sql",
        &["query_doc_id,neighbor_doc_id,cosine_distance,rank"],
    );
    assert_eq!(r[0].len(), 25, "{:?}", r[0]);
    for (i, row) in r[0].iter().enumerate() {
        assert_ne!(row[0], row[1]);
        assert_eq!(num(&row[3]) as usize, i % 5 + 1);
        assert!((0.0..1.0).contains(&num(&row[2])));
    }
    let queries: Vec<&str> = r[0].iter().step_by(5).map(|r| r[0].as_str()).collect();
    assert_eq!(queries, ["10", "250", "1000", "2000", "3000"]);

    // The graph: 10 edges from each of the 3430 entries, no self loop; distance grows with rank.
    let r = example(
        "02_knn_graph.sql",
        &[
            "edges,nodes,self_loops",
            "mutual_edge_share",
            "rank,mean_distance,max_distance",
        ],
    );
    assert_eq!(r[0], [["34300", "3430", "0"]]);
    let mutual = num(&r[1][0][0]);
    assert!(mutual > 0.2 && mutual < 1.0, "{mutual}");
    assert_eq!(r[2].len(), 10);
    for w in r[2].windows(2) {
        assert!(num(&w[0][1]) <= num(&w[1][1]), "{:?}", r[2]);
    }

    // All the 'AB' names of the cut; pairs within 0.25, nearest first.
    let r = example(
        "03_string_matching.sql",
        &["names,ngrams", "query_name,neighbor_name,cosine_distance"],
    );
    assert_eq!(r[0][0][0], "1607");
    assert_eq!(r[1].len(), 25);
    let d: Vec<f64> = r[1].iter().map(|row| num(row.last().unwrap())).collect();
    assert!(d.windows(2).all(|w| w[0] <= w[1]) && d[24] <= 0.25, "{d:?}");

    // Cells 12 and 24 with 15 neighbours each, then accuracy per cell type for 300 queries.
    let r = example(
        "04_jensen_shannon.sql",
        &[
            "query_cell,query_celltype,neighbor_celltype,js_distance,rank",
            "celltype,queries,accuracy",
        ],
    );
    assert_eq!(r[0].len(), 30);
    assert_eq!(r[1].len(), 10, "ten cell types: {:?}", r[1]);
    let queries: f64 = r[1].iter().map(|row| num(&row[1])).sum();
    let correct: f64 = r[1].iter().map(|row| num(&row[1]) * num(&row[2])).sum();
    assert_eq!(queries, 300.0);
    // A majority vote of 15 neighbours beats guessing the most common type (267 of 1258).
    assert!(correct / queries > 0.6, "accuracy {}", correct / queries);
    let b_cells = r[1].iter().find(|row| row[0] == "CD19+ B").unwrap();
    assert!(num(&b_cells[2]) > 0.9, "{b_cells:?}");

    // Every test post of the cut, classified well above chance (1 in 20).
    let r = example(
        "05_news20_classification.sql",
        &[
            "test_posts,accuracy",
            "newsgroup,posts,accuracy",
            "doc,neighbour,newsgroup,neighbour_newsgroup,distance,word,weight",
        ],
    );
    assert_eq!(r[0][0][0], "503");
    let accuracy = num(&r[0][0][1]);
    assert!(accuracy > 0.6, "accuracy {accuracy}");
    assert_eq!(r[1].len(), 20);
    // Three posts, five shared words each, named through the vocabulary, heaviest first.
    assert_eq!(r[2].len(), 15, "{:?}", r[2]);
    for rows in r[2].chunks(5) {
        assert!(rows.iter().all(|row| row[0] == rows[0][0]));
        assert!(rows.iter().all(|row| row[5].len() >= 2));
        assert!(rows.windows(2).all(|w| num(&w[0][6]) >= num(&w[1][6])));
    }

    // within=newsgroup: 503 test posts, 5 neighbours each, all of the post's own newsgroup.
    let r = example(
        "06_within_newsgroup.sql",
        &[
            "pairs,posts,other_newsgroup",
            "post,newsgroup,neighbour,cosine_distance,rank",
        ],
    );
    assert_eq!(r[0], [["2515", "503", "0"]]);
    assert_eq!(r[1].len(), 9, "{:?}", r[1]);
    for rows in r[1].chunks(3) {
        assert!(rows
            .iter()
            .all(|row| row[0] == rows[0][0] && row[1] == rows[0][1]));
        assert!(rows.windows(2).all(|w| num(&w[0][3]) <= num(&w[1][3])));
    }
}

/// The README's quick start, command by command, as a new user runs it: from a copy of the
/// repository's data and examples, with `sparse-knn` on the path.
#[test]
fn readme_quick_start_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Quick start"))
        .expect("the README has a Quick start section");
    assert!(
        section.contains("cargo install --path ."),
        "the quick start says how to install the binary"
    );
    let dir = tempfile::tempdir().unwrap();
    for sub in ["data", "sql-examples"] {
        copy_dir(&root.join(sub), &dir.path().join(sub));
    }
    let mut commands = Vec::new();
    for block in section.split("```sh\n").skip(1) {
        let block = block.split("```").next().unwrap();
        let joined = block.replace("\\\n", " ");
        commands.extend(
            joined
                .lines()
                .filter(|l| l.starts_with("sparse-knn "))
                .map(str::to_string),
        );
    }
    assert!(commands.len() >= 3, "{commands:?}");
    for command in &commands {
        let args: Vec<&str> = command.split_whitespace().skip(1).collect();
        let out = Command::new(env!("CARGO_BIN_EXE_sparse-knn"))
            .args(&args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if args[0] == "sql" {
            assert!(String::from_utf8_lossy(&out.stdout).lines().count() >= 5);
        }
    }
    assert_eq!(
        read(&dir.path().join("neighbours.parquet"))
            .iter()
            .map(|b| b.num_rows())
            .sum::<usize>(),
        20000 * 10
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
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

#[test]
fn a_failed_knn_leaves_the_existing_output_and_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = generate(dir.path(), "good.parquet", "secedgar", 50, 1);
    let out = dir.path().join("out.parquet");
    let o = out.to_str().unwrap();
    let g = good.to_str().unwrap();
    ok(&[
        "knn", "--left", g, "--right", g, "--metric", "cosine", "-k", "2", "--output", o,
    ]);
    let before = std::fs::read(&out).unwrap();
    // A left file with a bad vector in it: the job fails once it reaches that row.
    let bad = dir.path().join("bad.parquet");
    let sql = format!(
        "COPY (SELECT id, CASE WHEN id = 40 THEN named_struct('indices', [1, 1], 'values', [1.0, 2.0]) ELSE vec END AS vec \
         FROM '{g}') TO '{}' STORED AS PARQUET",
        bad.display()
    );
    ok(&["sql", "-c", &sql]);
    let e = fails(&[
        "knn",
        "--left",
        bad.to_str().unwrap(),
        "--right",
        g,
        "--metric",
        "cosine",
        "-k",
        "2",
        "--output",
        o,
        "--overwrite",
    ]);
    assert!(e.contains("duplicate index 1"), "{e}");
    assert_eq!(
        std::fs::read(&out).unwrap(),
        before,
        "the good output was replaced"
    );
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 3, "a temporary file was left: {names:?}");
}

#[test]
fn a_closed_stdout_stops_quietly_with_a_failure_code() {
    use std::io::Read;
    let mut child = bin()
        .args([
            "sql",
            "--format",
            "csv",
            "-c",
            "SELECT * FROM generate_series(1, 5000000)",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 64];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(141), "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A copy of `src` whose vector column holds 64-bit lists: Struct{indices: LargeList<Int64>,
/// values: LargeList<Float64>} (the layout of a column of more than 2^31 entries).
fn write_large_list_copy(src: &Path, dst: &Path) {
    use arrow::array::{Array, ArrayRef, StructArray};
    use arrow::compute::cast;
    use arrow::datatypes::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;
    use std::sync::Arc;

    let large = |t: DataType| DataType::LargeList(Arc::new(Field::new("item", t, false)));
    let mut writer: Option<ArrowWriter<File>> = None;
    for b in read(src) {
        let at = b.schema().index_of("vec").unwrap();
        let s = b.column(at).as_struct();
        let indices = cast(
            s.column_by_name("indices").unwrap(),
            &large(DataType::Int64),
        )
        .unwrap();
        let values = cast(
            s.column_by_name("values").unwrap(),
            &large(DataType::Float64),
        )
        .unwrap();
        let fields = vec![
            Field::new("indices", indices.data_type().clone(), false),
            Field::new("values", values.data_type().clone(), false),
        ];
        let vec = StructArray::new(fields.into(), vec![indices, values], s.nulls().cloned());
        let mut columns: Vec<ArrayRef> = b.columns().to_vec();
        columns[at] = Arc::new(vec);
        let mut schema_fields: Vec<Field> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        schema_fields[at] = Field::new("vec", columns[at].data_type().clone(), true);
        let batch = RecordBatch::try_new(Arc::new(Schema::new(schema_fields)), columns).unwrap();
        writer
            .get_or_insert_with(|| {
                ArrowWriter::try_new(File::create(dst).unwrap(), batch.schema(), None).unwrap()
            })
            .write(&batch)
            .unwrap();
    }
    writer.unwrap().close().unwrap();
}

/// The `knn` job's whole output, run with `env` set (e.g. a lowered chunk limit).
fn knn_output(
    dir: &Path,
    file: &Path,
    metric: &str,
    device: &str,
    env: &[(&str, &str)],
) -> RecordBatch {
    let out = dir.join(format!("out_{metric}_{}.parquet", env.len()));
    let _ = std::fs::remove_file(&out);
    let f = file.to_str().unwrap();
    let o = out.to_str().unwrap();
    let result = bin()
        .args([
            "knn",
            "--left",
            f,
            "--right",
            f,
            "--metric",
            metric,
            "-k",
            "7",
            "--exclude-self",
            "--device",
            device,
            "--output",
            o,
        ])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        result.status.success(),
        "{metric} {env:?}: {}",
        String::from_utf8_lossy(&result.stderr)
    );
    let batches = read(&out);
    arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
}

/// `sql -c` with `env` set, as CSV.
fn sql_with_env(query: &str, env: &[(&str, &str)]) -> String {
    let out = bin()
        .args(["sql", "--format", "csv", "-c", query])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{query}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A right side past the entries one batch's 32-bit offsets address is cut into shards (and a
/// left batch past it into pieces) whose answers merge to the one-piece answers, bit for bit and
/// in the same tie order, for the canonical and the LargeList layout. The limit (2^31 - 1) is
/// lowered with SPARSE_KNN_MAX_CHUNK_NNZ so that small data crosses it.
fn chunked_sides_give_the_same_answers(device: &str) {
    let dir = tempfile::tempdir().unwrap();
    let canonical = generate(dir.path(), "g.parquet", "movielens", 1500, 21);
    let large = dir.path().join("large.parquet");
    write_large_list_copy(&canonical, &large);
    let lowered = [("SPARSE_KNN_MAX_CHUNK_NNZ", "2500")];
    for file in [&canonical, &large] {
        for metric in [
            "cosine",
            "manhattan",
            "jensenshannon",
            "chebyshev",
            "minkowski",
        ] {
            // The reference is always the CPU in one piece.
            let whole = knn_output(dir.path(), file, metric, "cpu", &[]);
            let chunked = knn_output(dir.path(), file, metric, device, &lowered);
            assert!(whole.num_rows() > 1000, "{metric}: {}", whole.num_rows());
            assert_eq!(whole, chunked, "{metric} on {}", file.display());
        }
        let f = file.to_str().unwrap();
        let radius = format!(
            "SELECT query_id, neighbor_id, distance FROM radius_join('{f}', '{f}', 'cosine', 0.9, \
             'device={device}') ORDER BY query_id, neighbor_id"
        );
        let cpu = radius.replace(&format!("device={device}"), "device=cpu");
        let (whole, chunked) = (sql_with_env(&cpu, &[]), sql_with_env(&radius, &lowered));
        assert!(whole.lines().count() > 5000, "{}", whole.lines().count());
        assert_eq!(whole, chunked);
        // The lowered limit did cut the right side.
        let plan = sql_with_env(
            &format!(
                "EXPLAIN ANALYZE SELECT count(*) FROM knn_join('{f}', '{f}', 'cosine', 3, \
                 'device={device}')"
            ),
            &lowered,
        );
        let shards: usize = plan
            .split("build_shards=")
            .nth(1)
            .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no build_shards in {plan}"));
        assert!(shards > 10, "{shards} shards: {plan}");
    }
}

#[test]
fn chunked_sides_give_the_same_answers_on_the_cpu() {
    chunked_sides_give_the_same_answers("cpu");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn chunked_sides_give_the_same_answers_on_the_gpu() {
    chunked_sides_give_the_same_answers("gpu");
}
