//! GPU joins through SQL, in a test binary of their own (the fault test breaks the device for
//! whatever else runs in the process at that moment; run with `--test-threads=1`):
//! - after a kernel fault (a sticky CUDA error: every later call on that context fails), the
//!   device is reset where the driver allows it, refused with a reason where not, and
//!   `device=auto` goes on on the CPU;
//! - k above the kernels' own top-k runs on the GPU, `gpus=` picks GPUs.
//!
//! Needs a CUDA GPU: `cargo test --release --test gpu_sql -- --ignored --test-threads=1`.

use std::sync::Arc;

use crate::common::pairs;
use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::prelude::SessionContext;
use datafusion_sparse_knn::SparseBatch;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Rows of up to `max_degree` raw counts (1..3000) over 500 columns, every fifth one a copy of
/// an earlier row (exact ties).
fn rows(seed: u64, n: usize, max_degree: usize) -> Vec<Vec<(i32, f32)>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out: Vec<Vec<(i32, f32)>> = Vec::with_capacity(n);
    for r in 0..n {
        if r % 5 == 4 {
            let copy = out[r / 2].clone();
            out.push(copy);
            continue;
        }
        let mut cols: Vec<i32> = (0..rng.random_range(1..max_degree))
            .map(|_| rng.random_range(0..500))
            .collect();
        cols.sort_unstable();
        cols.dedup();
        out.push(
            cols.into_iter()
                .map(|c| (c, rng.random_range(1..3000) as f32))
                .collect(),
        );
    }
    out
}

fn context(rows: &[Vec<(i32, f32)>]) -> SessionContext {
    let vectors = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", datafusion_sparse_knn::sparse_vector_type(), true),
    ]));
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows.len() as i64));
    let batch = RecordBatch::try_new(schema, vec![ids, Arc::new(vectors.to_array())]).unwrap();
    let ctx = datafusion_sparse_knn::session_context();
    ctx.register_batch("t", batch).unwrap();
    ctx
}

async fn query(ctx: &SessionContext, sql: &str) -> datafusion::error::Result<Vec<RecordBatch>> {
    ctx.sql(sql).await?.collect().await
}

/// A right side with no rows on the GPU: no pairs, no error (the shards of an empty side are one
/// empty index).
#[tokio::test]
#[ignore = "needs a CUDA GPU"]
async fn an_empty_right_side_gives_no_pairs_on_the_gpu() {
    let ctx = context(&rows(5, 100, 20));
    for function in ["knn_join", "radius_join"] {
        let amount = if function == "knn_join" { "3" } else { "0.5" };
        let sql = format!(
            "SELECT count(*) FROM {function}(t, (SELECT * FROM t WHERE id < 0), 'cosine', \
             {amount}, 'device=gpu')"
        );
        let out = query(&ctx, &sql).await.unwrap();
        assert_eq!(
            out[0].column(0).as_primitive::<Int64Type>().value(0),
            0,
            "{sql}"
        );
    }
}

/// A kernel fault (a sticky CUDA error) leaves the driver refusing work on that GPU: the next
/// query resets the device and opens it again where the driver allows it, and otherwise gets a
/// reason that says to restart the process, while `device=auto` runs on the CPU with the same
/// answers. The fault spoils the GPU for the whole process, and the integration tests are one
/// binary: the test runs itself again in a child process, which takes the fault.
#[tokio::test]
#[ignore = "needs a CUDA GPU"]
async fn a_kernel_fault_leaves_auto_on_the_cpu_or_a_fresh_gpu() {
    const CHILD: &str = "SPARSE_KNN_TEST_FAULT_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let name = "gpu_sql::a_kernel_fault_leaves_auto_on_the_cpu_or_a_fresh_gpu";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                name,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
        return;
    }
    let ctx = context(&rows(3, 2000, 40));
    // No kept index holds the device: the query after the fault is the only user, so the
    // device is reset (or refused) rather than waiting for a cached side to go.
    ctx.sql("SET sparse_knn.index_cache = '0'")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let sql = |device: &str| {
        format!(
            "SELECT query_id, neighbor_id, distance, rank FROM knn_join(t, t, 'euclidean', 5, \
             'device={device}') ORDER BY query_id, rank"
        )
    };
    let on_gpu = pairs(&query(&ctx, &sql("gpu")).await.unwrap());
    let on_cpu = pairs(&query(&ctx, &sql("cpu")).await.unwrap());

    let fault = datafusion_sparse_knn::gpu::fault_for_tests(0).unwrap_err();
    assert!(fault.to_string().contains("ILLEGAL_ADDRESS"), "{fault}");

    match query(&ctx, &sql("gpu")).await {
        Ok(again) => {
            eprintln!("the device was reset and opened again");
            assert_eq!(pairs(&again), on_gpu);
        }
        Err(e) => {
            let e = e.to_string();
            eprintln!("the device stays refused: {e}");
            assert!(e.contains("restart the process"), "{e}");
            let plan = query(&ctx, &format!("EXPLAIN VERBOSE {}", sql("auto")))
                .await
                .unwrap();
            let text = arrow::util::pretty::pretty_format_batches(&plan)
                .unwrap()
                .to_string();
            assert!(text.contains("device=cpu (auto: "), "{text}");
        }
    }
    // device=auto runs wherever it can, with the CPU's answers.
    let auto = pairs(&query(&ctx, &sql("auto")).await.unwrap());
    assert_eq!(auto.len(), on_cpu.len());
    for (a, c) in auto.iter().zip(&on_cpu) {
        assert_eq!((a.0, a.3), (c.0, c.3));
        assert!((a.2 - c.2).abs() <= 1e-9 * (1.0 + c.2.abs()), "{a:?} {c:?}");
    }
}

/// k above the kernels' own top-k (1024) runs on the GPU: EXPLAIN ANALYZE shows that GPU's
/// kernel time and the bytes it was sent, and the distances equal the CPU's rank by rank.
/// `gpus=` picks GPUs (EXPLAIN says which); an ordinal that is not there is an error.
#[tokio::test]
#[ignore = "needs a CUDA GPU"]
async fn large_k_and_chosen_gpus_run_on_the_gpu() {
    let ctx = context(&rows(44, 6000, 60));
    let sql = |options: &str| {
        format!("SELECT * FROM knn_join(t, t, 'cosine', 5000, '{options}') ORDER BY query_id, rank")
    };
    let gpu = pairs(&query(&ctx, &sql("device=gpu, gpus=0")).await.unwrap());
    let cpu = pairs(&query(&ctx, &sql("device=cpu")).await.unwrap());
    assert_eq!(gpu.len(), 6000 * 5000);
    assert_eq!(gpu.len(), cpu.len());
    let mut same_neighbour = 0usize;
    for (g, c) in gpu.iter().zip(&cpu) {
        assert_eq!((g.0, g.3), (c.0, c.3));
        assert!(
            (g.2 - c.2).abs() <= 1e-9 * (1.0 + c.2.abs()),
            "query {} rank {}: {} vs {}",
            g.0,
            g.3,
            g.2,
            c.2
        );
        same_neighbour += usize::from(g.1 == c.1);
    }
    // Ties order differently only where the backends' distances differ in the last bits.
    assert!(
        same_neighbour * 100 >= gpu.len() * 99,
        "{same_neighbour} of {}",
        gpu.len()
    );

    let analyzed = query(
        &ctx,
        &format!("EXPLAIN ANALYZE {}", sql("device=gpu, gpus=0")),
    )
    .await
    .unwrap();
    let text = arrow::util::pretty::pretty_format_batches(&analyzed)
        .unwrap()
        .to_string();
    assert!(text.contains("k=5000, device=gpu, gpus=0"), "{text}");
    assert!(text.contains("kernel_time_gpu0="), "{text}");
    assert!(!text.contains(" bytes_to_device=0,"), "{text}");

    let e = query(&ctx, &sql("device=gpu, gpus=0,57"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("gpus names GPU 57"), "{e}");
}
