//! Index folders that refresh (issue "Data that grows", item 3): `sparse-knn index` over a folder
//! writes an index of segments with a manifest; run again over the grown folder it writes only
//! the new files' segment and a new manifest; a rewritten or removed file is an error naming it,
//! or a refresh with `--refresh`. A join over the folder, `SparseIndex::open` and a table read it
//! like an index file, with a fresh build's answer; a refresh killed at any moment leaves an index
//! a reader opens, and a process querying while another refreshes reads the old index or the new.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use datafusion_sparse_knn::index::SparseIndex;
use datafusion_sparse_knn::metric::MetricKind;

use crate::common::{collect, counts, explain_counters, write_parquet};
use crate::growing::{answer, assert_equal_but_rounding, rounding, uncached_session};

/// Options that every metric's index and join take here (p for minkowski, dim where needed).
const OPTIONS: &str = "p=3, dim=60";

fn cli() -> Command {
    Command::new(crate::common::sparse_knn_bin())
}

fn index_command(folder: &Path, output: &Path, extra: &[&str]) -> Command {
    let mut command = cli();
    command
        .arg("index")
        .arg("--input")
        .arg(folder)
        .arg("--output")
        .arg(output)
        .args(extra);
    command
}

fn run(command: &mut Command) -> Output {
    command.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn ok(command: &mut Command) -> String {
    let out = run(command);
    assert!(out.status.success(), "{command:?}: {}", stderr(&out));
    stderr(&out)
}

fn failed(command: &mut Command) -> String {
    let out = run(command);
    assert!(
        !out.status.success(),
        "{command:?} succeeded: {}",
        stderr(&out)
    );
    stderr(&out)
}

fn manifest(index: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(index.join("manifest.json")).unwrap()).unwrap()
}

/// The segment files a manifest names, in order.
fn segment_files(index: &Path) -> Vec<String> {
    manifest(index)["segments"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["file"].as_str().map(str::to_string))
        .collect()
}

fn every_metric() -> Vec<MetricKind> {
    MetricKind::all().collect()
}

/// Every metric's answer over the index folder equals a fresh build's over the folder's files.
async fn same_as_the_folder(index: &Path, folder: &Path, queries: &Path, step: &str) {
    let loaded = datafusion_sparse_knn::session_context();
    let fresh = uncached_session().await;
    for kind in every_metric() {
        let metric = kind.name();
        let sql = |right: &Path| {
            format!(
                "SELECT * FROM knn_join('{q}', '{r}', '{metric}', 7, 'device=cpu, {OPTIONS}') \
                 ORDER BY query_id, rank",
                q = queries.display(),
                r = right.display(),
            )
        };
        let got = answer(&collect(&loaded, &sql(index)).await);
        // The folder with its trailing slash: a folder URL.
        let want = answer(&collect(&fresh, &sql(&folder.join(""))).await);
        assert!(got.len() >= 4 * 7, "{metric} {step}: {} pairs", got.len());
        match rounding(kind, "cpu") {
            None => assert_eq!(got, want, "{metric} {step}"),
            Some(tolerance) => {
                assert_equal_but_rounding(&got, &want, tolerance, &format!("{metric} {step}"))
            }
        }
    }
}

fn data(dir: &Path) -> (PathBuf, PathBuf) {
    let folder = dir.join("docs");
    std::fs::create_dir(&folder).unwrap();
    write_parquet(&folder.join("a.parquet"), &counts(150, 91), 0);
    write_parquet(&folder.join("b.parquet"), &counts(150, 92), 1000);
    let queries = dir.join("q.parquet");
    write_parquet(&queries, &counts(5, 93), 9000);
    (folder, queries)
}

#[tokio::test]
async fn an_index_folder_refreshes_with_its_new_files_alone_and_answers_like_them() {
    let dir = tempfile::tempdir().unwrap();
    let (folder, queries) = data(dir.path());
    let index = dir.path().join("docs.skidx");
    let metrics: Vec<&str> = every_metric().iter().map(|k| k.name()).collect();
    let metrics = metrics.join(",");
    let first = ["--metric", &metrics, "--options", OPTIONS];

    let said = ok(&mut index_command(&folder, &index, &first));
    assert!(said.contains("300 rows of 2 files in 1 segments"), "{said}");
    let segments = segment_files(&index);
    assert_eq!(segments.len(), 1);
    let first_segment = std::fs::read(index.join(&segments[0])).unwrap();
    same_as_the_folder(&index, &folder, &queries, "built").await;

    // A file added: a run without arguments but the paths keeps the metrics and options, keeps
    // the first segment as it is, and builds the new file's alone.
    write_parquet(&folder.join("c.parquet"), &counts(40, 94), 2000);
    let said = ok(&mut index_command(&folder, &index, &[]));
    assert!(said.contains("1 files of 3 to read"), "{said}");
    assert!(
        said.contains("340 rows of 3 files in 2 segments (1 built)"),
        "{said}"
    );
    let grown = segment_files(&index);
    assert_eq!(grown.len(), 2);
    assert_eq!(grown[0], segments[0]);
    assert_eq!(std::fs::read(index.join(&grown[0])).unwrap(), first_segment);
    same_as_the_folder(&index, &folder, &queries, "a file added").await;

    // Nothing new: nothing written.
    let generation = manifest(&index)["generation"].clone();
    let said = ok(&mut index_command(&folder, &index, &[]));
    assert!(said.contains("up to date"), "{said}");
    assert_eq!(manifest(&index)["generation"], generation);

    // Other metrics than the index's: refused, the index untouched.
    let err = failed(&mut index_command(&folder, &index, &["--metric", "cosine"]));
    assert!(
        err.contains("--overwrite") && err.contains("jaccard"),
        "{err}"
    );

    // A file rewritten: an error naming it, the index untouched; then --refresh.
    write_parquet(&folder.join("b.parquet"), &counts(120, 95), 3000);
    let err = failed(&mut index_command(&folder, &index, &[]));
    assert!(
        err.contains("b.parquet (rewritten)") && err.contains("--refresh"),
        "{err}"
    );
    assert_eq!(manifest(&index)["generation"], generation);
    let said = ok(&mut index_command(&folder, &index, &["--refresh"]));
    assert!(said.contains("310 rows of 3 files"), "{said}");
    same_as_the_folder(&index, &folder, &queries, "a file rewritten").await;

    // A file removed: named, then refreshed.
    std::fs::remove_file(folder.join("a.parquet")).unwrap();
    let err = failed(&mut index_command(&folder, &index, &[]));
    assert!(err.contains("a.parquet (removed)"), "{err}");
    ok(&mut index_command(&folder, &index, &["--refresh"]));
    same_as_the_folder(&index, &folder, &queries, "a file removed").await;

    // The index value and a table read the folder too.
    let opened = SparseIndex::open(&index).unwrap();
    assert_eq!(opened.rows(), 160);
    assert_eq!(opened.metrics().len(), every_metric().len());
    let ctx = datafusion_sparse_knn::session_context();
    ctx.register_table("corpus", opened.table()).unwrap();
    let count = collect(&ctx, "SELECT count(*) AS n, min(id) AS low FROM corpus").await;
    let n = count[0]
        .column(0)
        .as_any()
        .downcast_ref::<arrow::array::Int64Array>()
        .unwrap()
        .value(0);
    assert_eq!(n, 160);
    // A plain SELECT names the folder as it names a file.
    let printed = String::from_utf8(
        cli()
            .args(["sql", "--format", "csv", "-c"])
            .arg(format!("SELECT count(*) AS n FROM '{}'", index.display()))
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(printed.trim(), "n\n160", "{printed}");
    // A session keeps the loaded index while the manifest stands, and loads the folder again
    // once a refresh replaced it.
    let lookup = format!(
        "SELECT * FROM knn_join('{}', '{}', 'cosine', 3, 'device=cpu, {OPTIONS}')",
        queries.display(),
        index.display()
    );
    let counters = ["index_built", "index_loaded", "index_reused"];
    let session = datafusion_sparse_knn::session_context();
    assert_eq!(
        explain_counters(&session, &lookup, &counters).await,
        [0, 1, 0]
    );
    assert_eq!(
        explain_counters(&session, &lookup, &counters).await,
        [0, 0, 1]
    );
    write_parquet(&folder.join("d.parquet"), &counts(30, 98), 4000);
    ok(&mut index_command(&folder, &index, &[]));
    assert_eq!(
        explain_counters(&session, &lookup, &counters).await,
        [0, 1, 0]
    );
    // Only the manifest's segments, the one before's, and the lock remain: no temporary file.
    for entry in std::fs::read_dir(&index).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        assert!(!name.contains(".tmp-"), "{name} left behind");
    }
}

#[test]
fn what_is_not_an_index_folder_is_refused_and_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let (folder, _) = data(dir.path());
    // A folder of the user's under the index's name.
    let theirs = dir.path().join("theirs.skidx");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("notes.txt"), b"mine").unwrap();
    let err = failed(&mut index_command(&folder, &theirs, &[]));
    assert!(err.contains("not an index folder"), "{err}");
    assert_eq!(std::fs::read(theirs.join("notes.txt")).unwrap(), b"mine");
    // An index file where a folder's index would go.
    let file = dir.path().join("one.skidx");
    ok(&mut index_command(&folder.join("a.parquet"), &file, &[]));
    let before = std::fs::read(&file).unwrap();
    let err = failed(&mut index_command(&folder, &file, &["--overwrite"]));
    assert!(err.contains("is an index file"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), before);
    // --refresh of one file.
    let err = failed(&mut index_command(
        &folder.join("a.parquet"),
        &file,
        &["--refresh"],
    ));
    assert!(err.contains("is one file"), "{err}");
    // A manifest naming a segment that is not there: an error naming the folder.
    let index = dir.path().join("docs.skidx");
    ok(&mut index_command(&folder, &index, &[]));
    let segment = segment_files(&index).remove(0);
    std::fs::remove_file(index.join(&segment)).unwrap();
    let err = SparseIndex::open(&index).unwrap_err().to_string();
    assert!(
        err.contains(&segment) || err.contains("docs.skidx"),
        "{err}"
    );
}

/// Rows the index at `index` holds, opened and probed as a joining process would: the error
/// where it cannot be.
fn rows_read(index: &Path) -> Result<usize, String> {
    let opened = SparseIndex::open(index).map_err(|e| e.to_string())?;
    let queries = counts(1, 5);
    let batch = crate::common::batch(&queries);
    let metric = opened.first_metric();
    opened
        .probe_metric(
            &metric,
            &batch,
            datafusion_sparse_knn::join::Selection::Nearest(3),
            Default::default(),
        )
        .map_err(|e| e.to_string())?;
    Ok(opened.rows())
}

#[test]
fn a_refresh_killed_at_any_moment_leaves_the_old_index_or_the_new() {
    let dir = tempfile::tempdir().unwrap();
    let (folder, _) = data(dir.path());
    let index = dir.path().join("docs.skidx");
    ok(&mut index_command(&folder, &index, &[]));
    // A file large enough that its refresh takes a while to read, build and write.
    write_parquet(&folder.join("c.parquet"), &counts(20_000, 96), 10_000);
    let (old, new) = (300, 20_300);
    // Leftovers of writers that died: a half-written manifest and a segment no manifest names.
    std::fs::write(index.join(".manifest.json.tmp-1"), b"{\"sparse_knn").unwrap();
    std::fs::write(index.join("segment-000009-000.skidx"), b"SKIDX").unwrap();
    assert_eq!(rows_read(&index), Ok(old));
    let mut delay_ms = 0;
    for _ in 0..12 {
        let mut child = index_command(&folder, &index, &[])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        let status = child.wait().unwrap();
        let rows = rows_read(&index);
        assert!(
            rows == Ok(old) || rows == Ok(new),
            "killed after {delay_ms} ms ({status}): {rows:?}"
        );
        if rows == Ok(new) {
            break;
        }
        delay_ms = delay_ms * 2 + 25;
    }
    // Then a refresh that runs to its end (or finds the index up to date), and cleans up what
    // the dead writers left.
    ok(&mut index_command(&folder, &index, &[]));
    assert_eq!(rows_read(&index), Ok(new));
    let names: Vec<String> = std::fs::read_dir(&index)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.contains(".tmp-") || n == "segment-000009-000.skidx"),
        "{names:?}"
    );
}

#[test]
fn a_process_querying_while_another_refreshes_reads_the_old_index_or_the_new() {
    let dir = tempfile::tempdir().unwrap();
    let (folder, _) = data(dir.path());
    let index = dir.path().join("docs.skidx");
    ok(&mut index_command(&folder, &index, &[]));
    // The refresher: another process adding a file and refreshing, five times.
    let script = (0..5)
        .map(|i| {
            format!(
                "cp '{src}' '{dst}' && '{cli}' index --input '{folder}' --output '{index}' \
                 2>/dev/null || exit 1",
                src = folder.join("a.parquet").display(),
                dst = folder.join(format!("z{i}.parquet")).display(),
                cli = crate::common::sparse_knn_bin(),
                folder = folder.display(),
                index = index.display(),
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut refresher = Command::new("bash").arg("-c").arg(script).spawn().unwrap();
    let valid: Vec<usize> = (0..=5).map(|i| 300 + 150 * i).collect();
    let started = Instant::now();
    let mut seen = Vec::new();
    let finished = loop {
        let rows = rows_read(&index).unwrap_or_else(|e| panic!("a reader failed: {e}"));
        assert!(valid.contains(&rows), "{rows} rows read");
        assert!(
            seen.last().is_none_or(|&last| last <= rows),
            "{seen:?} then {rows}"
        );
        seen.push(rows);
        if let Some(status) = refresher.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the refresher still runs after 120 s"
        );
    };
    assert!(finished.success());
    assert_eq!(rows_read(&index), Ok(1050));
    assert!(seen.len() > 1, "{seen:?}");
}

#[tokio::test]
#[ignore = "needs a CUDA GPU"]
async fn a_gpu_join_over_an_index_folder_of_segments_answers_like_the_cpu() {
    assert!(
        datafusion_sparse_knn::gpu::is_available(),
        "no CUDA GPU: {}",
        datafusion_sparse_knn::gpu::describe()
    );
    let dir = tempfile::tempdir().unwrap();
    let (folder, queries) = data(dir.path());
    let index = dir.path().join("docs.skidx");
    let metrics = "cosine,dot,manhattan,jensenshannon,chebyshev,minkowski";
    ok(&mut index_command(
        &folder,
        &index,
        &["--metric", metrics, "--options", OPTIONS],
    ));
    write_parquet(&folder.join("c.parquet"), &counts(90, 97), 2000);
    ok(&mut index_command(&folder, &index, &[]));
    assert_eq!(segment_files(&index).len(), 2);
    // Against a fresh GPU build over the folder's files: the same kernels over other shards.
    let loaded = datafusion_sparse_knn::session_context();
    let fresh = uncached_session().await;
    for metric in metrics.split(',') {
        let kind: MetricKind = metric.parse().unwrap();
        let sql = |right: &Path| {
            format!(
                "SELECT * FROM knn_join('{q}', '{r}', '{metric}', 7, 'device=gpu, {OPTIONS}') \
                 ORDER BY query_id, rank",
                q = queries.display(),
                r = right.display(),
            )
        };
        let got = answer(&collect(&loaded, &sql(&index)).await);
        let want = answer(&collect(&fresh, &sql(&folder.join(""))).await);
        assert_eq!(got.len(), 5 * 7, "{metric}");
        match rounding(kind, "gpu") {
            None => assert_eq!(got, want, "{metric}"),
            Some(tolerance) => assert_equal_but_rounding(&got, &want, tolerance, metric),
        }
    }
}
