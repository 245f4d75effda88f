//! After a kernel fault (a sticky CUDA error: every later call on that context fails), the next
//! query opens the device again and runs. Its own test binary: the fault breaks the device for
//! whatever else runs in the process at that moment.
//!
//! Needs a CUDA GPU: `cargo test --release --test gpu_fault -- --ignored`.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion_sparse_knn::SparseBatch;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[tokio::test]
#[ignore = "needs a CUDA GPU"]
async fn a_query_after_a_kernel_fault_runs_on_a_fresh_context() {
    let mut rng = StdRng::seed_from_u64(3);
    let rows: Vec<Vec<(i32, f32)>> = (0..2000)
        .map(|_| {
            let mut cols: Vec<i32> = (0..rng.random_range(1..40))
                .map(|_| rng.random_range(0..500))
                .collect();
            cols.sort_unstable();
            cols.dedup();
            cols.into_iter()
                .map(|c| (c, rng.random_range(1..3000) as f32))
                .collect()
        })
        .collect();
    let vectors = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", datafusion_sparse_knn::sparse_vector_type(), true),
    ]));
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows.len() as i64));
    let batch = RecordBatch::try_new(schema, vec![ids, Arc::new(vectors.to_array())]).unwrap();
    let ctx = datafusion_sparse_knn::session_context();
    ctx.register_batch("t", batch).unwrap();
    let sql = "SELECT query_id, neighbor_id, distance FROM knn_join(t, t, 'euclidean', 5, \
               'device=gpu') ORDER BY query_id, rank";
    let run = || async { ctx.sql(sql).await?.collect().await };
    let before = run().await.unwrap();

    let fault = datafusion_sparse_knn::gpu::fault_for_tests(0).unwrap_err();
    assert!(fault.to_string().contains("ILLEGAL_ADDRESS"), "{fault}");

    let after = run()
        .await
        .unwrap_or_else(|e| panic!("the query after the fault: {e}"));
    assert_eq!(before, after);
}
