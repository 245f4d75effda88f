//! `s3://` paths against a local S3 emulator (the `moto` server from PyPI, on 127.0.0.1, started
//! here): the `knn` job reading from and writing to S3 matches the local run, S3 URLs work as
//! `--table` paths and as `knn_join` arguments, and a failed job leaves no object behind.
//!
//! Skipped, with the reason printed, only where moto cannot be started; CI installs it and sets
//! `SPARSE_KNN_REQUIRE_MOTO=1`, which turns the skip into a failure.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sparse-knn");
const BUCKET: &str = "knn-test";

/// The emulator process, stopped when the test ends however it ends.
struct Moto {
    child: Child,
    port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn skip_or_fail(reason: &str) {
    if std::env::var_os("SPARSE_KNN_REQUIRE_MOTO").is_some_and(|v| v != "0") {
        panic!("SPARSE_KNN_REQUIRE_MOTO is set but {reason}");
    }
    eprintln!("SKIPPED tests/s3.rs: {reason} (pip install \"moto[server]\" to run it)");
}

fn start_moto(log: &Path) -> Result<Moto, String> {
    let probe = Command::new("python3")
        .args(["-c", "import moto.server"])
        .output()
        .map_err(|e| format!("python3 cannot be run: {e}"))?;
    if !probe.status.success() {
        return Err(format!(
            "python3 cannot import moto.server: {}",
            String::from_utf8_lossy(&probe.stderr).trim()
        ));
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free local port: {e}"))?
        .port();
    let log_file = std::fs::File::create(log).map_err(|e| e.to_string())?;
    let child = Command::new("python3")
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().map_err(|e| e.to_string())?)
        .stderr(log_file)
        .spawn()
        .map_err(|e| format!("cannot start moto: {e}"))?;
    let moto = Moto { child, port };
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if http(port, "GET", "/", b"").is_ok_and(|(status, _)| status == 200) {
            return Ok(moto);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!(
        "moto did not answer on port {port} within 60 s: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    ))
}

/// One unsigned HTTP/1.1 request to the emulator (it does not check signatures): status and body.
fn http(port: u16, method: &str, path: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let head_end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP header"))?;
    let head = String::from_utf8_lossy(&response[..head_end]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line: {head}")))?;
    Ok((status, response[head_end + 4..].to_vec()))
}

fn put(port: u16, key: &str, body: &[u8]) {
    let (status, text) = http(port, "PUT", &format!("/{BUCKET}/{key}"), body).unwrap();
    assert_eq!(status, 200, "PUT {key}: {}", String::from_utf8_lossy(&text));
}

/// Whether the object exists, asked with boto3 (installed with moto): object reads need a
/// signed request, which the plain HTTP helper does not make.
fn exists(port: u16, key: &str) -> bool {
    let script = format!(
        "import boto3, botocore\n\
         s3 = boto3.client('s3', endpoint_url='http://127.0.0.1:{port}', region_name='us-east-1', \
         aws_access_key_id='testing', aws_secret_access_key='testing')\n\
         try:\n    s3.head_object(Bucket='{BUCKET}', Key='{key}'); print('yes')\n\
         except botocore.exceptions.ClientError as e:\n    print(e.response['Error']['Code'])\n"
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        answer == "yes" || answer == "404",
        "head {key}: {answer} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    answer == "yes"
}

/// The binary with the AWS environment pointing at the emulator, and nothing else of AWS's.
fn bin(port: u16) -> Command {
    let mut c = Command::new(BIN);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("AWS_") {
            c.env_remove(key);
        }
    }
    c.env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"))
        .env("AWS_ALLOW_HTTP", "true");
    c
}

fn ok(mut c: Command) -> String {
    let out: Output = c.output().unwrap();
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        c,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fails(mut c: Command) -> String {
    let out: Output = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{c:?} should have failed");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    stderr
}

fn generate(dir: &Path, name: &str, rows: usize, seed: u64) -> PathBuf {
    let path = dir.join(name);
    let mut c = Command::new(BIN);
    c.args([
        "generate",
        "--shape",
        "movielens",
        "--rows",
        &rows.to_string(),
    ])
    .args(["--seed", &seed.to_string(), "--output"])
    .arg(&path);
    ok(c);
    path
}

/// A query's CSV output with its lines after the header sorted, to compare results whose row
/// order is not part of the contract.
fn sorted_csv(port: u16, sql: &str) -> Vec<String> {
    let mut c = bin(port);
    c.args(["sql", "--format", "csv", "-c", sql]);
    let text = ok(c);
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    assert!(lines.len() > 1, "no rows from {sql}:\n{text}");
    lines[1..].sort();
    lines
}

#[test]
fn s3_round_trip_matches_the_local_run() {
    let dir = tempfile::tempdir().unwrap();
    let moto = match start_moto(&dir.path().join("moto.log")) {
        Ok(m) => m,
        Err(reason) => return skip_or_fail(&reason),
    };
    let port = moto.port;
    let (status, body) = http(port, "PUT", &format!("/{BUCKET}"), b"").unwrap();
    assert_eq!(
        status,
        200,
        "create bucket: {}",
        String::from_utf8_lossy(&body)
    );

    let left = generate(dir.path(), "left.parquet", 60, 1);
    let right = generate(dir.path(), "right.parquet", 80, 2);
    put(port, "in/left.parquet", &std::fs::read(&left).unwrap());
    // The right side as an S3 folder (a prefix ending in '/') of one file.
    put(
        port,
        "in/right/part-0.parquet",
        &std::fs::read(&right).unwrap(),
    );

    let local_out = dir.path().join("local.parquet");
    let mut c = bin(port);
    c.args(["knn", "--metric", "cosine", "-k", "3", "--device", "cpu"])
        .arg("--left")
        .arg(&left)
        .arg("--right")
        .arg(&right)
        .arg("--output")
        .arg(&local_out);
    ok(c);

    let s3_out = format!("s3://{BUCKET}/out/knn.parquet");
    let mut c = bin(port);
    c.args(["knn", "--metric", "cosine", "-k", "3", "--device", "cpu"])
        .args(["--left", &format!("s3://{BUCKET}/in/left.parquet")])
        .args(["--right", &format!("s3://{BUCKET}/in/right/")])
        .args(["--output", &s3_out]);
    let summary = c.output().unwrap();
    assert!(
        summary.status.success(),
        "{}",
        String::from_utf8_lossy(&summary.stderr)
    );
    let summary = String::from_utf8_lossy(&summary.stderr);
    assert!(
        summary.contains("60 left rows x 80 right rows, 180 pairs") && summary.contains(&s3_out),
        "{summary}"
    );
    assert!(exists(port, "out/knn.parquet"));

    // Read back through SQL's URL tables and compared with the local run, row for row.
    let from_s3 = sorted_csv(port, &format!("SELECT * FROM '{s3_out}'"));
    let local = sorted_csv(port, &format!("SELECT * FROM '{}'", local_out.display()));
    assert_eq!(from_s3.len(), 181);
    assert_eq!(from_s3, local);

    // An existing object is not replaced without --overwrite; with it, it is.
    let mut c = bin(port);
    c.args(["knn", "--metric", "cosine", "-k", "2"])
        .args(["--left", &format!("s3://{BUCKET}/in/left.parquet")])
        .arg("--right")
        .arg(&right)
        .args(["--output", &s3_out]);
    let e = fails(c);
    assert!(e.contains("exists; pass --overwrite"), "{e}");
    let mut c = bin(port);
    c.args(["knn", "--metric", "cosine", "-k", "2", "--overwrite"])
        .args(["--left", &format!("s3://{BUCKET}/in/left.parquet")])
        .arg("--right")
        .arg(&right)
        .args(["--output", &s3_out]);
    ok(c);
    let replaced = sorted_csv(port, &format!("SELECT count(*) AS n FROM '{s3_out}'"));
    assert_eq!(replaced, ["n", "120"]);

    // S3 paths as --table paths and as knn_join arguments.
    let mut c = bin(port);
    c.args(["sql", "--format", "csv"])
        .args(["--table", &format!("l=s3://{BUCKET}/in/left.parquet")])
        .args([
            "-c",
            &format!(
                "SELECT (SELECT count(*) FROM l) AS l_rows, count(*) AS pairs \
                 FROM knn_join('s3://{BUCKET}/in/left.parquet', 's3://{BUCKET}/in/right/', 'cosine', 2)"
            ),
        ]);
    assert_eq!(ok(c).trim(), "l_rows,pairs\n60,120");

    // A missing object is an error that names it.
    let mut c = bin(port);
    c.args(["sql", "-c"]).arg(format!(
        "SELECT * FROM knn_join('s3://{BUCKET}/in/nothing.parquet', 's3://{BUCKET}/in/right/', 'cosine', 2)"
    ));
    let e = fails(c);
    assert!(
        e.contains(&format!("s3://{BUCKET}/in/nothing.parquet")),
        "{e}"
    );

    // Plain HTTP to the endpoint must be allowed explicitly, and the error says how.
    let mut c = bin(port);
    c.env_remove("AWS_ALLOW_HTTP").args([
        "sql",
        "--table",
        &format!("l=s3://{BUCKET}/in/left.parquet"),
        "-c",
        "SELECT 1",
    ]);
    let e = fails(c);
    assert!(e.contains("AWS_ALLOW_HTTP=true"), "{e}");

    // A job that fails once the output is open leaves no object: on a machine without a GPU,
    // device=gpu fails when the plan is made, after --output was checked and opened.
    let mut c = bin(port);
    c.args(["knn", "--metric", "cosine", "-k", "2", "--device", "gpu"])
        .args(["--left", &format!("s3://{BUCKET}/in/left.parquet")])
        .arg("--right")
        .arg(&right)
        .args(["--output", &format!("s3://{BUCKET}/out/failed.parquet")]);
    let out = c.output().unwrap();
    if out.status.success() {
        eprintln!("a GPU is present: the failed-upload case was not exercised");
        assert!(exists(port, "out/failed.parquet"));
    } else {
        assert!(!exists(port, "out/failed.parquet"));
    }
    drop(moto);
}
