//! Runs the examples of the documentation: `cargo test --release --test docs`.
//!
//! In `README.md` and every `docs/*.md`, each ` ```sql ` block runs, in file order, in one session
//! per file (`session_context()`, in the repository root so that `data/...` paths resolve). The
//! fenced block right after it, if any, says what the block must give:
//! - ` ```text `: the query results, exactly as `sparse-knn sql` prints them (one table per
//!   statement that returns rows, in order);
//! - ` ```error `: the block's last statement fails and its message contains this text (every
//!   line of it, in order); the statements before it must succeed;
//! - anything else, or no block: every statement must succeed.
//!
//! Each ` ```rust ` block of those files must appear, line for line (indentation aside), in this
//! file, where a test below runs it.
//!
//! `DOCS_BLESS=1 cargo test --release --test docs` rewrites the ` ```text ` blocks from what the
//! statements print; review the diff, it is not a substitute for checking the figures.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::AsArray;
use arrow::datatypes::{Float64Type, Int32Type, Int64Type, SchemaRef};
use datafusion::error::Result;
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::DFParser;
use datafusion::sql::sqlparser::dialect::GenericDialect;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One fenced block: its info string (` ```sql ` → "sql"), its text, and the byte range of the
/// text in the file (for blessing).
#[derive(Debug)]
struct Block {
    info: String,
    text: String,
    range: std::ops::Range<usize>,
    line: usize,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(String, usize, usize)> = None;
    let mut offset = 0;
    for (n, line) in markdown.split_inclusive('\n').enumerate() {
        let trimmed = line.trim_end();
        match &open {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    open = Some((info.trim().to_string(), offset + line.len(), n + 1));
                }
            }
            Some((info, start, first)) => {
                if trimmed == "```" {
                    out.push(Block {
                        info: info.clone(),
                        text: markdown[*start..offset].to_string(),
                        range: *start..offset,
                        line: *first,
                    });
                    open = None;
                }
            }
        }
        offset += line.len();
    }
    assert!(open.is_none(), "a fenced block is not closed");
    out
}

/// What `sparse-knn sql` prints for one script: each statement planned against the state the
/// ones before it left, and a table for each that returns columns.
async fn run_sql(ctx: &SessionContext, sql: &str) -> Result<String> {
    let mut printed = Vec::new();
    for statement in DFParser::parse_sql_with_dialect(sql, &GenericDialect {})? {
        let plan = ctx.state().statement_to_plan(statement).await?;
        let df = ctx.execute_logical_plan(plan).await?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        let batches = df.collect().await?;
        if !schema.fields().is_empty() {
            printed.push(
                arrow::util::pretty::pretty_format_batches_with_schema(schema, &batches)?
                    .to_string(),
            );
        }
    }
    Ok(printed.join("\n"))
}

/// Splits a script into its statements' texts, so that an ` ```error ` block can let the ones
/// before the failing statement run first.
fn statements(sql: &str) -> Vec<String> {
    DFParser::parse_sql_with_dialect(sql, &GenericDialect {})
        .unwrap_or_else(|e| panic!("cannot parse {sql}: {e}"))
        .into_iter()
        .map(|s| s.to_string())
        .collect()
}

fn doc_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ is there")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files.insert(0, root().join("README.md"));
    files
}

#[tokio::test(flavor = "multi_thread")]
async fn sql_examples_in_the_docs_give_what_they_show() {
    std::env::set_current_dir(root()).unwrap();
    let bless = std::env::var_os("DOCS_BLESS").is_some();
    let mut failures = Vec::new();
    let mut checked = 0;
    for file in doc_files() {
        let name = file.strip_prefix(root()).unwrap().display().to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        let all = blocks(&text);
        let ctx = datafusion_sparse_knn::session_context();
        let mut rewrites: Vec<(std::ops::Range<usize>, String)> = Vec::new();
        for (i, block) in all.iter().enumerate() {
            if block.info != "sql" {
                continue;
            }
            let at = format!("{name}:{}", block.line);
            // The next block is this one's result if it is a result block and at most a short
            // paragraph stands between them; further away, it belongs to another example.
            let next = all.get(i + 1).filter(|b| {
                let between = &text[block.range.end..b.range.start];
                let prose = between
                    .lines()
                    .filter(|l| !l.trim().is_empty() && !l.starts_with("```"))
                    .count();
                (b.info == "text" || b.info == "error") && prose <= 3
            });
            match next.map(|b| b.info.as_str()) {
                Some("error") => {
                    let expected = next.unwrap().text.trim();
                    let mut stmts = statements(&block.text);
                    let last = stmts.pop().expect("an error block follows a statement");
                    for s in &stmts {
                        if let Err(e) = run_sql(&ctx, s).await {
                            failures.push(format!("{at}: {s}\n  failed: {e}"));
                        }
                    }
                    match run_sql(&ctx, &last).await {
                        Ok(out) => failures.push(format!(
                            "{at}: {last}\n  should fail with '{expected}', printed:\n{out}"
                        )),
                        Err(e) => {
                            let message = e.strip_backtrace();
                            let mut rest = message.as_str();
                            for want in expected.lines().map(str::trim) {
                                match rest.find(want) {
                                    Some(p) => rest = &rest[p + want.len()..],
                                    None => {
                                        failures.push(format!(
                                            "{at}: {last}\n  error '{message}' lacks '{want}'"
                                        ));
                                        break;
                                    }
                                }
                            }
                        }
                    }
                }
                other => match run_sql(&ctx, &block.text).await {
                    Err(e) => failures.push(format!(
                        "{at}: {}\n  failed: {}",
                        block.text.trim(),
                        e.strip_backtrace()
                    )),
                    Ok(out) if other == Some("text") => {
                        let expected = next.unwrap();
                        if out.trim_end() != expected.text.trim_end() {
                            if bless {
                                rewrites.push((expected.range.clone(), format!("{out}\n")));
                            } else {
                                failures.push(format!(
                                    "{at}: {}\n  printed:\n{out}\n  the doc shows:\n{}",
                                    block.text.trim(),
                                    expected.text
                                ));
                            }
                        }
                    }
                    Ok(_) => {}
                },
            }
            checked += 1;
        }
        if !rewrites.is_empty() {
            let mut text = text.clone();
            for (range, new) in rewrites.into_iter().rev() {
                text.replace_range(range, &new);
            }
            std::fs::write(&file, text).unwrap();
            eprintln!("rewrote the results in {name}");
        }
    }
    assert!(
        checked >= 30,
        "only {checked} sql blocks found: are the docs there?"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn rust_examples_in_the_docs_are_the_ones_tested_here() {
    let source: Vec<String> = include_str!("docs.rs")
        .lines()
        .map(|l| l.trim().to_string())
        .collect();
    let mut found = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for block in blocks(&text).iter().filter(|b| b.info == "rust") {
            found += 1;
            let lines: Vec<String> = block.text.lines().map(|l| l.trim().to_string()).collect();
            let here = source.windows(lines.len()).any(|w| w == lines.as_slice());
            assert!(
                here,
                "{}:{}: this rust block is not in tests/it/docs.rs, so nothing runs it:\n{}",
                file.display(),
                block.line,
                block.text
            );
        }
    }
    assert!(found >= 3, "only {found} rust blocks in the docs");
}

#[test]
fn docs_link_only_to_files_in_the_repository() {
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let dir = file.parent().unwrap();
        // [label](target): every relative target must exist.
        for (n, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(p) = rest.find("](") {
                let after = &rest[p + 2..];
                let Some(end) = after.find(')') else { break };
                let target = &after[..end];
                rest = &after[end..];
                if target.starts_with("http://")
                    || target.starts_with("https://")
                    || target.starts_with('#')
                {
                    continue;
                }
                let path = target.split('#').next().unwrap();
                let resolved = dir.join(path);
                assert!(
                    resolved.exists(),
                    "{}:{}: link to '{target}', which is not in the repository",
                    file.display(),
                    n + 1
                );
                let canonical = resolved.canonicalize().unwrap();
                assert!(
                    canonical.starts_with(root().canonicalize().unwrap()),
                    "{}:{}: link to '{target}' leaves the repository",
                    file.display(),
                    n + 1
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The Rust examples of README.md and docs/rust-api.md, verbatim, and the tests that run them.

mod readme_example {
    use super::*;
    use datafusion::arrow::array::RecordBatch;
    use datafusion::error::Result;
    use datafusion::prelude::*;

    async fn similar_documents() -> Result<Vec<RecordBatch>> {
        let ctx = datafusion_sparse_knn::session_context(); // or register_all(&existing_ctx)?
        let docs = ctx
            .read_parquet("data/kos_bow.parquet", ParquetReadOptions::default())
            .await?;
        let pairs = datafusion_sparse_knn::planner::knn_join(
            docs.clone(),
            docs,
            "cosine",
            10,
            "exclude_self=true",
        )?;
        pairs
            .sort(vec![
                col("query_doc_id").sort(true, true),
                col("rank").sort(true, true),
            ])?
            .limit(0, Some(20))?
            .collect()
            .await
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn readme_rust_example_runs() {
        std::env::set_current_dir(root()).unwrap();
        let batches = similar_documents().await.unwrap();
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert_eq!(rows, 20);
        let b = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
        let names: Vec<&str> = b
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(
            names,
            ["query_doc_id", "neighbor_doc_id", "distance", "rank"]
        );
        let q = b.column(0).as_primitive::<Int64Type>();
        let n = b.column(1).as_primitive::<Int64Type>();
        let d = b.column(2).as_primitive::<Float64Type>();
        let r = b.column(3).as_primitive::<Int32Type>();
        for i in 0..20 {
            // The first two documents, ten neighbours each, never themselves, nearest first.
            assert_eq!(q.value(i), q.value(0) + (i / 10) as i64);
            assert_eq!(r.value(i), (i % 10) as i32 + 1);
            assert_ne!(q.value(i), n.value(i));
            assert!((0.0..=1.0).contains(&d.value(i)));
            if i % 10 > 0 {
                assert!(d.value(i - 1) <= d.value(i));
            }
        }
    }
}

mod rust_api_examples {
    use super::*;
    use datafusion::arrow::array::RecordBatch;
    use datafusion::error::Result;
    use datafusion::prelude::*;

    async fn sql_in_a_new_session() -> Result<Vec<RecordBatch>> {
        let ctx = datafusion_sparse_knn::session_context();
        ctx.register_parquet("kos", "data/kos_bow.parquet", ParquetReadOptions::default())
            .await?;
        ctx.sql(
            "SELECT query_doc_id, neighbor_doc_id, distance, rank \
             FROM knn_join((SELECT * FROM kos WHERE doc_id = 1), kos, 'cosine', 3)",
        )
        .await?
        .collect()
        .await
    }

    async fn sql_in_your_own_session() -> Result<Vec<RecordBatch>> {
        let config = SessionConfig::new().with_target_partitions(4);
        let ctx = SessionContext::new_with_config(config);
        datafusion_sparse_knn::register_all(&ctx)?;
        ctx.sql("SET sparse_knn.device = 'cpu'")
            .await?
            .collect()
            .await?;
        ctx.sql("SELECT sparse_distance([1.0, 0, 2], [0.0, 1, 2], 'manhattan') AS d")
            .await?
            .collect()
            .await
    }

    async fn dataframe_join() -> Result<Vec<RecordBatch>> {
        use datafusion::execution::FunctionRegistry;
        use datafusion::functions_aggregate::expr_fn::count;
        use datafusion_sparse_knn::planner::{knn_join, radius_join};

        let ctx = datafusion_sparse_knn::session_context();
        let normalize = ctx.udf("sparse_normalize")?;
        let cells = ctx
            .read_parquet(
                "data/pbmc_facs_counts.parquet",
                ParquetReadOptions::default(),
            )
            .await?
            .select(vec![
                col("barcode"),
                col("celltype"),
                normalize.call(vec![col("vec"), lit("l1")]).alias("vec"),
            ])?;
        let queries = cells.clone().limit(0, Some(5))?;
        // The 3 nearest cells of each of 5 cells, by Jensen-Shannon distance.
        let nearest = knn_join(queries.clone(), cells.clone(), "js", 3, "device=cpu")?;
        // How many cells lie within 0.5 of each of them: the join is a DataFrame like any other.
        let close = radius_join(queries, cells, "jensenshannon", 0.5, "")?.aggregate(
            vec![col("query_barcode")],
            vec![count(lit(1)).alias("within")],
        )?;
        let mut out = nearest.collect().await?;
        out.extend(close.collect().await?);
        Ok(out)
    }

    async fn index_that_outlives_the_statement() -> Result<Vec<RecordBatch>> {
        use datafusion_sparse_knn::index::SparseIndex;

        let ctx = datafusion_sparse_knn::session_context();
        let docs = ctx
            .read_parquet("data/kos_bow.parquet", ParquetReadOptions::default())
            .await?;
        // Read, checked and indexed once, for two metrics.
        let index = SparseIndex::build(docs, &["cosine", "manhattan"], "device=cpu").await?;
        // Saved (rows, every column, and both indexes) and opened again: nothing is rebuilt.
        let path = std::env::temp_dir().join("kos_rust_api.skidx");
        index.save(&path)?;
        let index = SparseIndex::open(&path)?;
        // Probed by as many left sides as you like; the first metric is the default.
        let queries = ctx
            .read_parquet("data/kos_bow.parquet", ParquetReadOptions::default())
            .await?
            .filter(col("doc_id").lt(lit(3)))?;
        let mut out = index.knn(queries, 3, "")?.collect().await?;
        // As a table, knn_join probes it under any metric it serves.
        ctx.register_table("kos_index", index.table())?;
        out.extend(
            ctx.sql(
                "SELECT query_doc_id, neighbor_doc_id, distance FROM knn_join( \
                 (SELECT * FROM kos_index WHERE doc_id = 1), kos_index, 'manhattan', 2)",
            )
            .await?
            .collect()
            .await?,
        );
        std::fs::remove_file(&path)?;
        Ok(out)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rust_api_examples_run() {
        std::env::set_current_dir(root()).unwrap();

        let b = sql_in_a_new_session().await.unwrap();
        let b = arrow::compute::concat_batches(&b[0].schema(), &b).unwrap();
        assert_eq!(b.num_rows(), 3);
        // Document 1 is its own nearest neighbour, at distance 0.
        assert_eq!(b.column(1).as_primitive::<Int64Type>().value(0), 1);
        assert!(b.column(2).as_primitive::<Float64Type>().value(0).abs() < 1e-6);
        assert_eq!(b.column(3).as_primitive::<Int32Type>().values(), &[1, 2, 3]);

        let b = sql_in_your_own_session().await.unwrap();
        // |1 - 0| + |0 - 1| + |2 - 2|
        assert_eq!(b[0].column(0).as_primitive::<Float64Type>().value(0), 2.0);

        let b = dataframe_join().await.unwrap();
        let (nearest, close): (Vec<_>, Vec<_>) = b.iter().partition(|b| b.num_columns() > 2);
        let nearest = arrow::compute::concat_batches(&nearest[0].schema(), nearest).unwrap();
        assert_eq!(nearest.num_rows(), 15);
        let within: i64 = close
            .iter()
            .map(|b| arrow::compute::sum(b.column(1).as_primitive::<Int64Type>()).unwrap_or(0))
            .sum();
        // Each query is within 0.5 of itself at least, and not of every cell.
        assert!((5..5 * 1258).contains(&within), "{within}");
        let d = nearest
            .column_by_name("distance")
            .unwrap()
            .as_primitive::<Float64Type>();
        assert!(d
            .iter()
            .all(|d| d.is_some_and(|d| (0.0..=1.0).contains(&d))));

        let b = index_that_outlives_the_statement().await.unwrap();
        let (by_value, by_table): (Vec<_>, Vec<_>) = b.iter().partition(|b| b.num_columns() == 4);
        // Documents 0-2, three neighbours each.
        let by_value = arrow::compute::concat_batches(&by_value[0].schema(), by_value).unwrap();
        assert_eq!(by_value.num_rows(), 9);
        let by_table = arrow::compute::concat_batches(&by_table[0].schema(), by_table).unwrap();
        assert_eq!(by_table.num_rows(), 2);
        assert_eq!(by_table.column(1).as_primitive::<Int64Type>().value(0), 1);
        assert_eq!(
            by_table.column(2).as_primitive::<Float64Type>().value(0),
            0.0
        );
    }
}
