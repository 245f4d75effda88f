//! `sparse-knn sql` as a user meets it: the interactive shell through a pseudo-terminal, and the
//! session flags (`--memory-limit`, settings in `SHOW ALL`) from the command line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use rexpect::session::{spawn_with_options, Options, PtySession};

const BIN: &str = env!("CARGO_BIN_EXE_sparse-knn");
const PROMPT: &str = "sparse-knn> ";

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run sparse-knn")
}

/// A small Parquet table of sparse vectors, made by the binary itself.
fn table(dir: &Path) -> PathBuf {
    let path = dir.join("docs.parquet");
    let out = run(&[
        "generate",
        "--shape",
        "movielens",
        "--rows",
        "40",
        "--seed",
        "3",
        "--output",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "generate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

fn shell(home: &Path, table: &Path) -> PtySession {
    let mut cmd = Command::new(BIN);
    cmd.args(["sql", "--table", &format!("docs={}", table.display())])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        // History goes to this test's own home, never the user's.
        .env("HOME", home)
        .env_remove("SPARSE_KNN_HISTORY")
        .env("TERM", "xterm");
    spawn_with_options(
        cmd,
        Options::new()
            .timeout_ms(Some(60_000))
            .strip_ansi_escape_codes(true),
    )
    .expect("start the shell in a pseudo-terminal")
}

/// Types one line and presses Enter.
fn type_line(p: &mut PtySession, line: &str) {
    p.send(line).unwrap();
    p.send("\r").unwrap();
    p.flush().unwrap();
}

#[test]
fn interactive_shell_edits_runs_lists_and_cancels() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let table = table(dir.path());
    let mut p = shell(&home, &table);
    p.exp_string("\\? for help").unwrap();
    p.exp_string(PROMPT).unwrap();

    // A statement over two lines runs when the `;` ends it.
    type_line(&mut p, "SELECT 6 *");
    type_line(&mut p, "  7 AS answer;");
    p.exp_string("answer").unwrap();
    p.exp_string("42").unwrap();
    p.exp_string("1 row in set").unwrap();
    p.exp_string(PROMPT).unwrap();

    // \d lists the table registered with --table; \df the crate's functions.
    type_line(&mut p, "\\d");
    p.exp_string("docs").unwrap();
    p.exp_string(PROMPT).unwrap();
    type_line(&mut p, "\\df");
    p.exp_string("knn_join").unwrap();
    p.exp_string(PROMPT).unwrap();
    type_line(&mut p, "\\df sparse_dist");
    p.exp_string("sparse_distance").unwrap();
    p.exp_string(PROMPT).unwrap();

    // Settings, as SET and SHOW.
    type_line(&mut p, "SET sparse_knn.device = 'cpu';");
    p.exp_string(PROMPT).unwrap();
    type_line(&mut p, "SHOW sparse_knn.device;");
    p.exp_regex(r"sparse_knn\.device\s*\|\s*cpu").unwrap();
    p.exp_string(PROMPT).unwrap();

    // A query of the registered table, in another output format.
    type_line(&mut p, "\\format csv");
    p.exp_string(PROMPT).unwrap();
    type_line(&mut p, "SELECT count(*) AS n FROM docs;");
    p.exp_string("n\r\n40").unwrap();
    p.exp_string(PROMPT).unwrap();

    // An error is reported and the shell goes on.
    type_line(&mut p, "SELECT * FROM no_such_table;");
    p.exp_string("Error:").unwrap();
    p.exp_string("no_such_table").unwrap();
    p.exp_string(PROMPT).unwrap();

    // Ctrl-C cancels a long statement, not the shell.
    type_line(
        &mut p,
        "SELECT max(value % 7) FROM range(1, 100000000000000);",
    );
    std::thread::sleep(Duration::from_millis(1500));
    p.send_control('c').unwrap();
    p.exp_string("cancelled").unwrap();
    p.exp_string(PROMPT).unwrap();
    type_line(&mut p, "SELECT 'still here' AS status;");
    p.exp_string("still here").unwrap();
    p.exp_string(PROMPT).unwrap();

    type_line(&mut p, "\\q");
    p.exp_eof().unwrap();

    // The history file holds what was typed (a multi-line statement as one entry).
    let history = std::fs::read_to_string(home.join(".sparse_knn_history")).unwrap();
    assert!(history.starts_with("#V2"), "{history}");
    assert!(history.contains("AS answer;"), "{history}");
    assert!(
        history.contains("\\\\df sparse_dist") || history.contains("\\df sparse_dist"),
        "{history}"
    );
}

#[test]
fn shell_leaves_a_foreign_history_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let notes = home.join(".sparse_knn_history");
    std::fs::write(&notes, "my own notes\n").unwrap();
    let table = table(dir.path());
    let mut p = shell(&home, &table);
    p.exp_string("not keeping history").unwrap();
    p.exp_string(PROMPT).unwrap();
    type_line(&mut p, "SELECT 1 AS one;");
    p.exp_string("one").unwrap();
    p.exp_string(PROMPT).unwrap();
    // End of input quits too.
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my own notes\n");
}

#[test]
fn memory_limit_sets_the_pool() {
    let out = run(&[
        "sql",
        "--memory-limit",
        "2G",
        "--format",
        "csv",
        "-c",
        "SHOW datafusion.runtime.memory_limit",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("datafusion.runtime.memory_limit,2G"),
        "{stdout}"
    );

    // Too small a pool fails the join with a resources error, not an abort.
    let out = run(&[
        "sql",
        "--memory-limit",
        "16K",
        "-c",
        "SELECT count(*) FROM knn_join(\
           (SELECT value AS id, sparse_vector([CAST(value % 50 AS INT), 60], [1.0, 2.0]) AS v FROM range(0, 3000)),\
           (SELECT value AS id, sparse_vector([CAST(value % 40 AS INT), 60], [1.0, 1.0]) AS v FROM range(0, 3000)),\
           'cosine', 5)",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("Resources exhausted"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");

    let out = run(&["sql", "--memory-limit", "lots", "-c", "SELECT 1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--memory-limit must be a size like 512MiB or 8GiB, got 'lots'"),
        "{stderr}"
    );
}

#[test]
fn show_all_lists_every_setting() {
    let out = run(&[
        "sql",
        "--format",
        "csv",
        "-c",
        "SET sparse_knn.dim = 128; SHOW ALL",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "sparse_knn.device,auto",
        "sparse_knn.dim,128",
        "sparse_knn.exclude_self,false",
        "sparse_knn.gpu_memory_limit,",
        "sparse_knn.p,2",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "{line} missing:\n{stdout}"
        );
    }
    // Nothing of ours without its prefix.
    assert!(
        !stdout.lines().any(|l| l.starts_with("device,")),
        "{stdout}"
    );
}
