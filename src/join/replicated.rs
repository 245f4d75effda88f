//! A right side held whole by several indexes at once (one per GPU, when it fits on each). A
//! probe goes whole to the index with the least work queued, so that concurrent probes (the left
//! side's partitions, each with probes in flight) keep every GPU busy at the launch size one GPU
//! would run; a probe large enough that each idle index gets a full launch is cut instead into
//! consecutive ranges of about equal work, probed at once. No index sees a part of the right
//! side, so nothing is merged: the ranges' pairs are the answer, laid end to end.

use std::sync::Mutex;

use arrow::array::RecordBatch;
use arrow::buffer::BooleanBuffer;
use datafusion::common::{exec_datafusion_err, exec_err, Result};

use super::backend::{JoinIndex, Probed};
use super::cancel::Cancel;
use super::mask::RowMask;
use super::mask_program::MaskProgram;
use super::matrix::{MatrixOut, MatrixRows};
use super::selection::{ProbeOptions, Selection};
use crate::metric::Metric;
use crate::vector::SparseBatch;

/// Left rows a range of a cut probe holds at least: on two H100s, cutting bench's 8,192-row
/// probes in two made the kernels 8% longer in sum than one GPU's (a launch ends on its few
/// longest rows with most of the device idle, and halving the launch doubles that share).
const MIN_RANGE_ROWS: usize = 8192;

/// What each replica has to do, and where the search for the least loaded starts (it moves on
/// with every probe, so that probes one after another use every replica).
struct Load {
    work: Vec<u64>,
    turn: usize,
}

/// Several indexes over the same right rows, probed as one.
pub struct ReplicatedIndex {
    replicas: Vec<Box<dyn JoinIndex>>,
    /// Work (in [`ReplicatedIndex::row_work`]'s units) queued on or running in each replica.
    load: Mutex<Load>,
    min_range_rows: usize,
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
            load: Mutex::new(Load {
                work: vec![0; replicas.len()],
                turn: 0,
            }),
            replicas,
            min_range_rows: MIN_RANGE_ROWS,
            column_entries,
            right_rows: right.len(),
        })
    }

    /// Cut probes of at least `rows` rows per idle replica (tests cut small probes).
    #[doc(hidden)]
    pub fn with_min_range_rows(mut self, rows: usize) -> Self {
        self.min_range_rows = rows.max(1);
        self
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

    /// Where a probe of rows of `work` is cut for `n` indexes: `n + 1` row positions from 0 to
    /// `work.len()`, each range of about equal work.
    fn cuts(work: &[u64], n: usize) -> Vec<usize> {
        let total: u64 = work.iter().sum();
        let mut cuts = Vec::with_capacity(n + 1);
        cuts.push(0);
        let mut seen = 0u64;
        let mut row = 0;
        for g in 1..n {
            let target = total / n as u64 * g as u64;
            while row < work.len() && seen + work[row] / 2 < target {
                seen += work[row];
                row += 1;
            }
            cuts.push(row);
        }
        cuts.push(work.len());
        cuts
    }

    /// Which replicas take a probe of rows of `work`, and where it is cut for them (see
    /// [`ReplicatedIndex::cuts`]); their load is raised by their ranges' work until the returned
    /// [`Assigned`] drops. Cut between the idle replicas when there are two or more and each
    /// range keeps its full launch, else whole to the least loaded (of equal loads, the first
    /// from the one after the last chosen).
    fn assign(&self, work: &[u64]) -> Assigned<'_> {
        let mut load = self.load.lock().unwrap_or_else(|e| e.into_inner());
        let n = load.work.len();
        let idle: Vec<usize> = (0..n).filter(|&r| load.work[r] == 0).collect();
        let ranges = idle.len().min(work.len() / self.min_range_rows.max(1));
        let (replicas, cuts) = if ranges >= 2 {
            (idle[..ranges].to_vec(), Self::cuts(work, ranges))
        } else {
            let turn = load.turn;
            let least = (0..n)
                .map(|i| (turn + i) % n)
                .min_by_key(|&r| load.work[r])
                .expect("at least one replica");
            load.turn = (least + 1) % n;
            (vec![least], vec![0, work.len()])
        };
        let shares: Vec<u64> = cuts
            .windows(2)
            .map(|w| work[w[0]..w[1]].iter().sum::<u64>().max(1))
            .collect();
        for (&r, &share) in replicas.iter().zip(&shares) {
            load.work[r] += share;
        }
        Assigned {
            index: self,
            replicas,
            cuts,
            shares,
        }
    }
}

/// A probe's replicas and their ranges; gives their load back when dropped.
struct Assigned<'a> {
    index: &'a ReplicatedIndex,
    replicas: Vec<usize>,
    cuts: Vec<usize>,
    shares: Vec<u64>,
}

impl Drop for Assigned<'_> {
    fn drop(&mut self) {
        let mut load = self.index.load.lock().unwrap_or_else(|e| e.into_inner());
        for (&r, &share) in self.replicas.iter().zip(&self.shares) {
            load.work[r] = load.work[r].saturating_sub(share);
        }
    }
}

impl ReplicatedIndex {
    fn probe_replicas(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        mask: Option<&RowMask>,
        cancel: &Cancel,
    ) -> Result<Probed> {
        let probe = |replica: &dyn JoinIndex, left: &SparseBatch, options: ProbeOptions| match mask
        {
            None => replica.probe_cancellable(left, selection, options, cancel),
            Some(mask) => replica.probe_masked(left, selection, options, mask, cancel),
        };
        if self.replicas.len() == 1 {
            return probe(&*self.replicas[0], left, options);
        }
        let work: Vec<u64> = (0..left.len()).map(|r| self.row_work(left, r)).collect();
        let assigned = self.assign(&work);
        if let [replica] = assigned.replicas[..] {
            return probe(&*self.replicas[replica], left, options);
        }
        let results: Vec<Result<Probed>> = std::thread::scope(|scope| {
            let handles: Vec<_> = assigned
                .replicas
                .iter()
                .map(|&r| &self.replicas[r])
                .zip(assigned.cuts.windows(2))
                .filter(|(_, range)| range[1] > range[0])
                .map(|(replica, range)| {
                    let (start, end) = (range[0], range[1]);
                    scope.spawn(move || {
                        let part = left.slice(start, end - start);
                        let mut probed = probe(&**replica, &part, options.shifted(start))?;
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
        drop(assigned);
        let mut out = Probed::default();
        // In range order, so the pairs stay ordered by left row.
        for r in results {
            let parts = out.absorb(r?);
            out.parts.extend(parts);
        }
        Ok(out)
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
        self.probe_replicas(left, selection, options, None, cancel)
    }

    fn probe_masked(
        &self,
        left: &SparseBatch,
        selection: Selection,
        options: ProbeOptions,
        mask: &RowMask,
        cancel: &Cancel,
    ) -> Result<Probed> {
        self.probe_replicas(left, selection, options, Some(mask), cancel)
    }

    /// Consecutive ranges of left rows, one a replica, side by side: each writes rows of its own.
    fn distance_matrix(
        &self,
        metric: &Metric,
        left: MatrixRows<'_>,
        out: MatrixOut<'_>,
    ) -> Result<()> {
        let rows = left.rows();
        out.check(rows.len())?;
        let replicas = self.replicas.len().min(rows.len().max(1));
        if replicas <= 1 {
            return self.replicas[0].distance_matrix(metric, left, out);
        }
        let per = rows.len().div_ceil(replicas);
        let (stride, columns) = (out.stride, out.columns);
        let mut rest = &mut out.values[..];
        let results: Vec<Result<()>> = std::thread::scope(|scope| {
            let mut handles = Vec::with_capacity(replicas);
            for (i, replica) in self.replicas.iter().take(replicas).enumerate() {
                let start = i * per;
                let count = per.min(rows.len().saturating_sub(start));
                if count == 0 {
                    break;
                }
                let take = if start + count == rows.len() {
                    rest.len()
                } else {
                    count * stride
                };
                let (mine, after) = std::mem::take(&mut rest).split_at_mut(take);
                rest = after;
                let part = rows.slice(start, count);
                handles.push(scope.spawn(move || {
                    let out = MatrixOut {
                        values: mine,
                        stride,
                        columns,
                    };
                    replica.distance_matrix(metric, MatrixRows::Given(&part), out)
                }));
            }
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(exec_datafusion_err!("a replica's distance matrix panicked"))
                    })
                })
                .collect()
        });
        results.into_iter().collect()
    }

    /// The first replica's (each holds every row).
    fn mask_where_kept(
        &self,
        program: &MaskProgram,
        columns: &RecordBatch,
    ) -> Result<Option<BooleanBuffer>> {
        self.replicas[0].mask_where_kept(program, columns)
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
    use crate::join::PairList;
    use crate::metric::{row_distance, with_semiring, Metric};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;
    use std::time::Duration;

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

    /// Every pair computed row by row from the metric's definition (`join` builds on no
    /// backend): the k nearest by (distance, row), or every pair within the radius.
    struct Brute {
        right: SparseBatch,
        metric: Metric,
    }

    impl JoinIndex for Brute {
        fn probe_cancellable(
            &self,
            left: &SparseBatch,
            selection: Selection,
            options: ProbeOptions,
            _: &Cancel,
        ) -> Result<Probed> {
            let mut pairs = PairList::with_capacity(0);
            for l in 0..left.len() {
                let skip = options.excluded_right_row(l, self.right.len());
                let mut row: Vec<(f64, usize)> = (0..self.right.len())
                    .filter(|&r| Some(r) != skip)
                    .map(|r| {
                        let d = with_semiring!(self.metric, s => {
                            row_distance(&s, left.row(l), self.right.row(r))
                        });
                        (d, r)
                    })
                    .collect();
                row.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                match selection {
                    Selection::Nearest(k) => row.truncate(k),
                    Selection::Within(radius) => row.retain(|p| p.0 <= radius),
                }
                for (d, r) in row {
                    pairs.push(l as u32, r as u32, d);
                }
            }
            Ok(Probed {
                parts: vec![pairs],
                ..Probed::default()
            })
        }

        fn memory_size(&self) -> usize {
            0
        }
    }

    fn brute(right: &SparseBatch, metric: &Metric) -> Box<dyn JoinIndex> {
        Box::new(Brute {
            right: right.clone(),
            metric: *metric,
        })
    }

    #[test]
    fn replicas_answer_as_one_index_and_share_the_work() {
        let mut rng = StdRng::seed_from_u64(7);
        // A slice, as the build's pieces may be: its buffers hold rows, and a column, it lacks.
        let mut rows = random_rows(&mut rng, 300, 60);
        rows.push(vec![(5_000, 1.0)]);
        let right = SparseBatch::from_rows(rows.iter().map(|r| Some(r.as_slice()))).slice(0, 300);
        let left = random_batch(&mut rng, 257, 60);
        for name in ["cosine", "manhattan", "jensenshannon"] {
            let metric = Metric::new(name, None, None).unwrap();
            let single = brute(&right, &metric);
            for replicas in [2, 3] {
                let mut index = ReplicatedIndex::new(
                    (0..replicas).map(|_| brute(&right, &metric)).collect(),
                    &right,
                )
                .unwrap();
                // Ranges of a few rows, so that this small probe is cut between the replicas.
                index.min_range_rows = 16;
                let work: Vec<u64> = (0..left.len()).map(|r| index.row_work(&left, r)).collect();
                let assigned = index.assign(&work);
                assert_eq!(assigned.replicas, (0..replicas).collect::<Vec<_>>());
                let cuts = assigned.cuts.clone();
                drop(assigned);
                assert_eq!(index.load.lock().unwrap().work, vec![0; replicas]);
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
                    // Whole, on one replica: the same pairs.
                    index.min_range_rows = usize::MAX;
                    let whole = index.probe(&left, selection, options).unwrap().into_pairs();
                    index.min_range_rows = 16;
                    assert_eq!(
                        whole, want,
                        "{name}, {replicas} replicas whole, {selection:?}"
                    );
                }
            }
        }
    }

    /// An index that records the rows it was asked for and takes 10 ms a row.
    struct Slow {
        probed: Arc<Mutex<Vec<usize>>>,
    }

    impl JoinIndex for Slow {
        fn probe_cancellable(
            &self,
            left: &SparseBatch,
            _: Selection,
            _: ProbeOptions,
            _: &Cancel,
        ) -> Result<Probed> {
            self.probed.lock().unwrap().push(left.len());
            std::thread::sleep(Duration::from_millis(10 * left.len() as u64));
            Ok(Probed::default())
        }

        fn memory_size(&self) -> usize {
            0
        }
    }

    #[test]
    fn probes_go_whole_to_the_least_loaded_replica() {
        let mut rng = StdRng::seed_from_u64(11);
        let right = random_batch(&mut rng, 50, 30);
        let batch = random_batch(&mut rng, 100, 30);
        let probed: Vec<Arc<Mutex<Vec<usize>>>> = (0..2).map(|_| Arc::default()).collect();
        let index = ReplicatedIndex::new(
            probed
                .iter()
                .map(|p| {
                    Box::new(Slow {
                        probed: Arc::clone(p),
                    }) as Box<dyn JoinIndex>
                })
                .collect(),
            &right,
        )
        .unwrap();
        let probe = |rows: usize| {
            index
                .probe(
                    &batch.slice(0, rows),
                    Selection::Nearest(3),
                    ProbeOptions::default(),
                )
                .unwrap()
        };
        // A (100 rows, 0-1000 ms) takes replica 0; B (50 rows, from 100 ms to 600) replica 1;
        // C (30 rows) starts at 800 ms, when replica 1 is idle and 0 still busy with A: replica
        // 1 again, though replica 0 would be next in turn. No probe is cut (each is far under
        // MIN_RANGE_ROWS).
        std::thread::scope(|scope| {
            let a = scope.spawn(|| probe(100));
            std::thread::sleep(Duration::from_millis(100));
            let b = scope.spawn(|| probe(50));
            std::thread::sleep(Duration::from_millis(700));
            probe(30);
            a.join().unwrap();
            b.join().unwrap();
        });
        assert_eq!(*probed[0].lock().unwrap(), vec![100]);
        assert_eq!(*probed[1].lock().unwrap(), vec![50, 30]);
        assert_eq!(index.load.lock().unwrap().work, vec![0, 0]);
        // Idle replicas of equal load take probes in turn.
        probe(1);
        probe(1);
        assert_eq!(*probed[0].lock().unwrap(), vec![100, 1]);
        assert_eq!(*probed[1].lock().unwrap(), vec![50, 30, 1]);
    }
}
