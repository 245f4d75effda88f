//! Runs every `tests/slt/**/*.slt` file against a session made by `register_all` (a module of
//! the `it` binary, not a binary of its own: one link of DataFusion and Ballista less).
//!
//! `cargo test --release --test it slt::`; `SLT_FILTER=joins_filtered,functions_norm` keeps the
//! files whose path contains one of the comma-separated words; `SLT_COMPLETE=1` rewrites the
//! expected results of the selected files from the actual ones (review the diff: it is for new
//! error texts and layouts, never a substitute for figures computed independently).
//!
//! Values are printed as DataFusion's own runner prints them (NULL, `(empty)` for the empty
//! string, true/false), except floats, which are rounded to 6 significant digits (and values
//! below 1e-12 in magnitude print as 0) so that expected figures computed with numpy match
//! independently of the last bits of float arithmetic. Nested values (the sparse vector struct,
//! lists, maps) use the same float rule inside.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float16Type, Float32Type, Float64Type};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use async_trait::async_trait;
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;
use sqllogictest::{DBOutput, DefaultColumnType};

/// An error as the .slt files see it: DataFusion's message without a backtrace.
#[derive(Debug)]
struct SltError(String);

impl std::fmt::Display for SltError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SltError {}

impl From<DataFusionError> for SltError {
    fn from(e: DataFusionError) -> Self {
        SltError(e.strip_backtrace())
    }
}

impl From<arrow::error::ArrowError> for SltError {
    fn from(e: arrow::error::ArrowError) -> Self {
        SltError(e.to_string())
    }
}

struct Db {
    ctx: SessionContext,
}

#[async_trait]
impl sqllogictest::AsyncDB for Db {
    type Error = SltError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, SltError> {
        let df = self.ctx.sql(sql).await?;
        let schema = df.schema().as_arrow().clone();
        let batches = df.collect().await?;
        // DDL, SET and the like return no columns: they are statements.
        if schema.fields().is_empty() {
            return Ok(DBOutput::StatementComplete(0));
        }
        let types = schema
            .fields()
            .iter()
            .map(|f| column_type(f.data_type()))
            .collect();
        let mut rows = Vec::new();
        for batch in &batches {
            rows.extend(batch_rows(batch)?);
        }
        Ok(DBOutput::Rows { types, rows })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "DataFusion"
    }

    async fn sleep(dur: std::time::Duration) {
        tokio::time::sleep(dur).await;
    }
}

fn column_type(t: &DataType) -> DefaultColumnType {
    match t {
        t if t.is_integer() => DefaultColumnType::Integer,
        t if t.is_floating() => DefaultColumnType::FloatingPoint,
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => DefaultColumnType::FloatingPoint,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DefaultColumnType::Text,
        _ => DefaultColumnType::Any,
    }
}

fn batch_rows(batch: &RecordBatch) -> Result<Vec<Vec<String>>, SltError> {
    let mut rows = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        let mut cells = Vec::with_capacity(batch.num_columns());
        for col in batch.columns() {
            let mut s = String::new();
            write_cell(&mut s, col, row, true)?;
            cells.push(s);
        }
        rows.push(cells);
    }
    Ok(rows)
}

/// Rounds to 6 significant digits and prints without an exponent; tiny values are 0.
fn float_to_str(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_string()
    } else if v == f64::INFINITY {
        "Infinity".to_string()
    } else if v == f64::NEG_INFINITY {
        "-Infinity".to_string()
    } else if v.abs() < 1e-12 {
        "0".to_string()
    } else {
        let rounded: f64 = format!("{v:.5e}")
            .parse()
            .expect("a formatted float parses");
        format!("{rounded}")
    }
}

/// One value; `top` cells print strings bare, nested strings are quoted like DataFusion's CLI.
fn write_cell(out: &mut String, col: &ArrayRef, row: usize, top: bool) -> Result<(), SltError> {
    if col.is_null(row) {
        out.push_str("NULL");
        return Ok(());
    }
    match col.data_type() {
        DataType::Float16 => out.push_str(&float_to_str(
            col.as_primitive::<Float16Type>().value(row).to_f64(),
        )),
        DataType::Float32 => out.push_str(&float_to_str(
            col.as_primitive::<Float32Type>().value(row) as f64,
        )),
        DataType::Float64 => {
            out.push_str(&float_to_str(col.as_primitive::<Float64Type>().value(row)))
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View if top => {
            let s = ArrayFormatter::try_new(col.as_ref(), &FormatOptions::default())?
                .value(row)
                .to_string();
            if s.is_empty() {
                out.push_str("(empty)");
            } else {
                out.push_str(s.trim_end_matches('\n'));
            }
        }
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _) => {
            let item = match col.data_type() {
                DataType::List(_) => col.as_list::<i32>().value(row),
                DataType::LargeList(_) => col.as_list::<i64>().value(row),
                _ => col.as_fixed_size_list().value(row),
            };
            out.push('[');
            for i in 0..item.len() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_cell(out, &item, i, false)?;
            }
            out.push(']');
        }
        DataType::Struct(fields) => {
            let s = col.as_struct();
            out.push('{');
            for (i, f) in fields.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write!(out, "{}: ", f.name()).expect("writing to a String");
                write_cell(out, s.column(i), row, false)?;
            }
            out.push('}');
        }
        DataType::Map(_, _) => {
            let m = col.as_map();
            let entries = m.value(row);
            out.push('{');
            for i in 0..entries.len() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_cell(out, entries.column(0), i, false)?;
                out.push_str(": ");
                write_cell(out, entries.column(1), i, false)?;
            }
            out.push('}');
        }
        _ => {
            let options = FormatOptions::default().with_null("NULL");
            out.push_str(
                &ArrayFormatter::try_new(col.as_ref(), &options)?
                    .value(row)
                    .to_string(),
            );
        }
    }
    Ok(())
}

fn slt_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            slt_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "slt") {
            out.push(path);
        }
    }
    Ok(())
}

fn new_runner() -> sqllogictest::Runner<Db, impl sqllogictest::MakeConnection<Conn = Db>> {
    let mut runner = sqllogictest::Runner::new(|| async {
        Ok::<_, SltError>(Db {
            ctx: datafusion_sparse_knn::session_context(),
        })
    });
    runner.with_column_validator(sqllogictest::strict_column_validator);
    runner
}

#[tokio::test]
async fn every_slt_file_passes() {
    let complete = std::env::var("SLT_COMPLETE").is_ok_and(|v| v == "1");
    let filter = std::env::var("SLT_FILTER").unwrap_or_default();
    let filters: Vec<&str> = filter.split(',').filter(|f| !f.is_empty()).collect();

    // Paths in the files (e.g. 'data/kos_bow.parquet') are relative to the crate root, which is
    // where cargo runs its tests.
    let crate_root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert_eq!(
        std::env::current_dir().ok().as_deref(),
        Some(crate_root),
        "the .slt files read paths relative to the crate root: run the tests from there"
    );
    let mut files = Vec::new();
    slt_files(&crate_root.join("tests").join("slt"), &mut files).expect("tests/slt is listed");
    files.sort();
    files.retain(|f| filters.is_empty() || filters.iter().any(|p| f.to_string_lossy().contains(p)));
    assert!(
        !files.is_empty(),
        "no .slt file matches SLT_FILTER={filter:?}"
    );

    let mut failed = Vec::new();
    for file in &files {
        let name = file
            .strip_prefix(crate_root)
            .unwrap_or(file)
            .display()
            .to_string();
        let started = std::time::Instant::now();
        let mut runner = new_runner();
        let result = if complete {
            runner
                .update_test_file(
                    file,
                    " ",
                    sqllogictest::default_validator,
                    sqllogictest::default_normalizer,
                    sqllogictest::strict_column_validator,
                )
                .await
                .map_err(|e| e.to_string())
        } else {
            runner
                .run_file_async(file)
                .await
                .map_err(|e| e.display(false).to_string())
        };
        match result {
            Ok(()) => println!("ok      {name} ({:.1}s)", started.elapsed().as_secs_f64()),
            Err(e) => {
                println!("FAILED  {name}\n{e}\n");
                failed.push(name);
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} .slt files failed: {failed:?} (their differences are printed above)",
        failed.len(),
        files.len()
    );
}
