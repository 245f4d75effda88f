//! Exact nearest-neighbour search and distance joins over sparse vectors for Apache DataFusion.
//!
//! - [`vector`]: the sparse vector column (canonical Arrow type, accepted inputs, validation).
//! - [`metric`]: the 16 metrics as semirings, defined once for both backends.
//! - [`cpu`]: the multi-core backend (inverted index + fused top-k).
//! - [`gpu`]: the CUDA backend (NVRTC-compiled kernels from `kernels/`).
//! - [`udf`]: the scalar SQL functions; [`planner`]: `knn_join` / `radius_join` operators.

pub mod cpu;
pub mod gpu;
pub mod metric;
pub mod options;
pub mod planner;
pub mod udf;
pub mod vector;

pub use metric::{Metric, MetricKind};
pub use vector::{sparse_vector_type, SparseBatch};
