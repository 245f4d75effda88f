//! A file added to a folder is seen by the next statement (issue "Data that grows", item 4): by
//! `knn_join` and a plain `SELECT` alike, in a session from `session_context()` and in one
//! `sparse-knn sql` process. DataFusion's default keeps a folder's first listing for the
//! session's life; these sessions list it again.

use std::process::Command;

use crate::common::{self, collect, counts, write_parquet};

#[tokio::test]
async fn a_new_file_in_a_folder_is_seen_by_the_next_statement() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("docs");
    std::fs::create_dir(&folder).unwrap();
    write_parquet(&folder.join("part0.parquet"), &counts(150, 61), 0);
    write_parquet(&folder.join("part1.parquet"), &counts(150, 62), 150);
    let query_row = counts(1, 63);
    let query = dir.path().join("q.parquet");
    write_parquet(&query, &query_row, 5000);

    let ctx = datafusion_sparse_knn::session_context();
    ctx.sql(&format!(
        "CREATE EXTERNAL TABLE docs STORED AS PARQUET LOCATION '{}/'",
        folder.display()
    ))
    .await
    .unwrap();
    ctx.register_parquet("q", query.to_str().unwrap(), Default::default())
        .await
        .unwrap();
    let count = "SELECT count(*) AS n FROM docs";
    let nearest = "SELECT * FROM knn_join(q, docs, 'cosine', 1, 'device=cpu')";
    let rows = |batches: &[arrow::array::RecordBatch]| {
        arrow::compute::cast(batches[0].column(0), &arrow::datatypes::DataType::Int64)
            .unwrap()
            .as_any()
            .downcast_ref::<arrow::array::Int64Array>()
            .unwrap()
            .value(0)
    };
    assert_eq!(rows(&collect(&ctx, count).await), 300);
    let before = common::pairs(&collect(&ctx, nearest).await);
    assert!(
        before[0].2 > 1e-6,
        "no copy of the query row yet: {before:?}"
    );

    // A copy of the query row arrives in a new file.
    write_parquet(&folder.join("part2.parquet"), &query_row, 9999);
    assert_eq!(rows(&collect(&ctx, count).await), 301);
    let after = common::pairs(&collect(&ctx, nearest).await);
    assert_eq!(after[0].1, 9999, "the new file's row: {after:?}");
    assert!(after[0].2.abs() < 1e-12, "{after:?}");

    // A removed file's rows go too.
    std::fs::remove_file(folder.join("part0.parquet")).unwrap();
    assert_eq!(rows(&collect(&ctx, count).await), 151);
}

#[test]
fn one_cli_process_sees_the_file_its_own_statement_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("f");
    std::fs::create_dir(&folder).unwrap();
    write_parquet(&folder.join("a.parquet"), &counts(40, 64), 0);
    let script = format!(
        "SELECT count(*) AS n FROM '{f}/';\n\
         COPY (SELECT id + 1000 AS id, v FROM '{f}/' WHERE id < 3) TO '{f}/b.parquet';\n\
         SELECT count(*) AS n FROM '{f}/';\n",
        f = folder.display()
    );
    let exe = std::env::var("SPARSE_KNN_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_sparse-knn").to_string());
    let out = Command::new(exe)
        .args(["sql", "--format", "csv", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counts: Vec<&str> = stdout
        .lines()
        .filter(|l| l.chars().all(|c| c.is_ascii_digit()) && !l.is_empty())
        .collect();
    assert_eq!(counts.first(), Some(&"40"), "{stdout}");
    assert_eq!(counts.last(), Some(&"43"), "{stdout}");
}
