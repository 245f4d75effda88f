//! A right side held whole by several indexes at once (one per GPU, when it fits on each): a
//! probe's left rows are cut into consecutive ranges of about equal work, one per index, probed
//! at once. No index sees a part of the right side, so nothing is merged: the ranges' pairs are
//! the answer, laid end to end.

use datafusion::common::{exec_datafusion_err, exec_err, Result};

use super::backend::{JoinIndex, Probed};
use super::cancel::Cancel;
use super::selection::{ProbeOptions, Selection};
use crate::vector::SparseBatch;

/// Several indexes over the same right rows, probed as one.
pub struct ReplicatedIndex {
    replicas: Vec<Box<dyn JoinIndex>>,
    /// Stored entries of each right column (indexed by column id; None when the column ids are
    /// too sparse for a table): the inverted lists a left row walks.
    column_entries: Option<Vec<u32>>,
    right_rows: usize,
}

impl ReplicatedIndex {
    /// `replicas` must each index all of `right`.
    pub fn new(replicas: Vec<Box<dyn JoinIndex>>, right: &SparseBatch) -> Result<Self> {
        if replicas.is_empty() {
            return exec_err!("a replicated index needs at least one replica");
        }
        let max_dim = right.max_dim();
        let column_entries = (max_dim <= 4 * right.nnz() + (1 << 20)).then(|| {
            let mut counts = vec![0u32; max_dim];
            // Row by row: a sliced batch shares buffers that hold other rows too.
            for r in 0..right.len() {
                let (indices, values) = right.row(r);
                for (&c, &v) in indices.iter().zip(values) {
                    if let (Some(n), true) = (counts.get_mut(c as u32 as usize), v != 0.0) {
                        *n = n.saturating_add(1);
                    }
                }
            }
            counts
        });
        Ok(Self {
            replicas,
            column_entries,
            right_rows: right.len(),
        })
    }

    /// The work of one left row, as the folded kernels do it: every tile's accumulators cleared
    /// and scanned once (a quarter of an inverted-list entry's cost per right row, about what a
    /// shared-memory pass costs next to a global load and an atomic add), plus the entries of
    /// the inverted lists of the row's columns. A model: it only has to cut a probe where each
    /// GPU finishes at about the same time.
    fn row_work(&self, left: &SparseBatch, row: usize) -> u64 {
        let (indices, values) = left.row(row);
        let fixed = self.right_rows as u64 / 4 + 1;
        let walked: u64 = match &self.column_entries {
            Some(counts) => indices
                .iter()
                .zip(values)
                .filter(|(_, v)| **v != 0.0)
                .map(|(&c, _)| counts.get(c as usize).copied().unwrap_or(0) as u64)
                .sum(),
            // Without a table, every entry counts as an average list.
            None => indices.len() as u64 * (self.right_rows as u64 / 64 + 1),
        };
        fixed + walked
    }

    /// Where `left` is cut: `replicas + 1` row positions from 0 to `left.len()`, each range of
    /// about equal work.
    fn cuts(&self, left: &SparseBatch) -> Vec<usize> {
        let n = self.replicas.len();
        let work: Vec<u64> = (0..left.len()).map(|r| self.row_work(left, r)).collect();
        let total: u64 = work.iter().sum();
        let mut cuts = Vec::with_capacity(n + 1);
        cuts.push(0);
        let mut seen = 0u64;
        let mut row = 0;
        for g in 1..n {
            let target = total / n as u64 * g as u64;
            while row < left.len() && seen + work[row] / 2 < target {
                seen += work[row];
                row += 1;
            }
            cuts.push(row);
        }
        cuts.push(left.len());
        cuts
    }
}

impl JoinIndex for ReplicatedIndex {
    fn probe_cancellable(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        cancel: &Cancel,
    ) -> Result<Probed> {
        if self.replicas.len() == 1 {
            return self.replicas[0].probe_cancellable(left, selection, options, cancel);
        }
        let cuts = self.cuts(left);
        let results: Vec<Result<Probed>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .replicas
                .iter()
                .zip(cuts.windows(2))
                .filter(|(_, range)| range[1] > range[0])
                .map(|(replica, range)| {
                    let (start, end) = (range[0], range[1]);
                    scope.spawn(move || {
                        let part = left.slice(start, end - start);
                        let mut probed = replica.probe_cancellable(
                            &part,
                            selection,
                            options.shifted(start),
                            cancel,
                        )?;
                        for part in &mut probed.parts {
                            for l in part.left.iter_mut() {
                                *l += start as u32;
                            }
                        }
                        Ok(probed)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(exec_datafusion_err!("a replica's probe panicked")))
                })
                .collect()
        });
        let mut out = Probed::default();
        // In range order, so the pairs stay ordered by left row.
        for r in results {
            let parts = out.absorb(r?);
            out.parts.extend(parts);
        }
        Ok(out)
    }

    /// One replica's host memory: the replicas share their host-side data.
    fn memory_size(&self) -> usize {
        self.replicas[0].memory_size() + self.column_entries.as_ref().map_or(0, |c| c.len() * 4)
    }

    fn build_bytes_to_device(&self) -> u64 {
        self.replicas
            .iter()
            .map(|r| r.build_bytes_to_device())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuBackend;
    use crate::join::Backend;
    use crate::metric::Metric;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn random_batch(rng: &mut StdRng, rows: usize, dim: i32) -> SparseBatch {
        let rows = random_rows(rng, rows, dim);
        SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice())))
    }

    fn random_rows(rng: &mut StdRng, rows: usize, dim: i32) -> Vec<Vec<(i32, f32)>> {
        (0..rows)
            .map(|r| {
                // Rows grow longer down the batch, so equal row counts would be unequal work.
                let len = 1 + r / 8 + rng.random_range(0..4);
                let mut cols: Vec<i32> = (0..len).map(|_| rng.random_range(0..dim)).collect();
                cols.sort_unstable();
                cols.dedup();
                cols.into_iter()
                    .map(|c| (c, rng.random_range(1..3000) as f32))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn replicas_answer_as_one_index_and_share_the_work() {
        let mut rng = StdRng::seed_from_u64(7);
        // A slice, as the build's pieces may be: its buffers hold rows, and a column, it lacks.
        let mut rows = random_rows(&mut rng, 300, 60);
        rows.push(vec![(5_000, 1.0)]);
        let right = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice()))).slice(0, 300);
        let left = random_batch(&mut rng, 257, 60);
        let backend = CpuBackend;
        for name in ["cosine", "manhattan", "jensenshannon"] {
            let metric = Metric::new(name, None, None).unwrap();
            let single = backend.build(&right, &metric).unwrap();
            for replicas in [2, 3] {
                let index = ReplicatedIndex::new(
                    (0..replicas)
                        .map(|_| backend.build(&right, &metric).unwrap())
                        .collect(),
                    &right,
                )
                .unwrap();
                let cuts = index.cuts(&left);
                assert_eq!(cuts.len(), replicas + 1);
                assert!(cuts.windows(2).all(|w| w[0] < w[1]), "{cuts:?}");
                // Later rows are longer: the first range must hold more rows than the last.
                assert!(cuts[1] - cuts[0] > cuts[replicas] - cuts[replicas - 1]);
                // A radius that keeps about half of each row's 5 nearest.
                let nearest = single
                    .probe(&left, Selection::Nearest(5), ProbeOptions::default())
                    .unwrap()
                    .into_pairs();
                let mut distances = nearest.distance.clone();
                distances.sort_by(f64::total_cmp);
                let radius = distances[distances.len() / 2];
                for (selection, exclude) in [
                    (Selection::Nearest(5), None),
                    (Selection::Nearest(5), Some(40)),
                    (Selection::Within(radius), Some(-3)),
                ] {
                    let options = ProbeOptions {
                        exclude_self_from: exclude,
                    };
                    let want = single
                        .probe(&left, selection, options)
                        .unwrap()
                        .into_pairs();
                    let got = index.probe(&left, selection, options).unwrap().into_pairs();
                    assert!(!want.is_empty());
                    assert_eq!(got, want, "{name}, {replicas} replicas, {selection:?}");
                }
            }
        }
    }
}
