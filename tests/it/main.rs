//! The integration tests, one binary: each module was a test binary of its own, and each of
//! those linked DataFusion and Ballista again (seventeen links, most of CI's build). Run one
//! module with `cargo test --release --test it cli::`; the GPU tests (`#[ignore = "needs a CUDA
//! GPU"]`) with `-- --ignored`.

mod cli;
#[cfg(feature = "cluster")]
mod cluster;
mod common;
mod custom_metric;
mod docs;
mod filtered;
mod gpu;
mod gpu_coalesce;
mod gpu_filtered;
mod gpu_matrix;
mod gpu_sql;
mod growing;
mod index_cache;
mod index_file;
mod index_folder;
mod joins;
mod lookup;
mod nvrtc_compile;
mod properties;
mod real_counts;
mod reference;
mod s3;
#[cfg(feature = "serve")]
mod serve;
mod shell;
mod slt;
mod vector_input;
mod within;
