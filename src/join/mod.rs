//! The backend-neutral core of `knn_join` and `radius_join`: what a probe is asked for
//! ([`Selection`], [`ProbeOptions`]), what it returns ([`PairList`]), the bounded top-k and the
//! merges of partial results, and the [`JoinIndex`] trait through which the planner's operators
//! talk to a backend. `src/cpu` and `src/gpu` both build on this module and never on each other.

mod backend;
mod cancel;
mod exact;
mod exclusion;
mod mask;
pub mod mask_program;
mod matrix;
mod merge;
mod pairs;
mod replicated;
mod selection;
mod sharded;
mod topk;
mod within;

pub use backend::{build_shards, join_shards, Backend, JoinIndex, Probed};
pub use cancel::{Cancel, CancelOnDrop};
pub use exact::ExactRows;
pub use exclusion::KeyGroups;
pub use mask::{bits_from_words, probe_masked_by_growing, RowMask};
pub use mask_program::MaskProgram;
pub use matrix::{matrix_by_probe, MatrixOut, MatrixRows};
pub use merge::{merge_nearest, merge_within};
pub(crate) use pairs::advise_huge_pages_of;
pub use pairs::{PairList, RowPairs};
pub use replicated::ReplicatedIndex;
pub use selection::{within, ProbeOptions, Selection};
pub use sharded::{join_pieces, max_chunk_nnz, split_row_ranges, split_rows, Shard, ShardedIndex};
pub use topk::TopK;
pub use within::{probe_within_groups, GroupMembers, GroupedProbe, NO_GROUP};
