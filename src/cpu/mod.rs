//! The CPU backend: an inverted index of the build side and a parallel probe with fused top-k.

mod chebyshev;
mod folded;
mod index;
mod probe;
mod topk;

pub use index::CpuIndex;
pub use probe::{probe, PairList, ProbeOptions, Selection};

#[cfg(test)]
mod tests;
