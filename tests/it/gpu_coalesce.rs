//! Lookups from many threads against one GPU index (a server's clients): those that find every
//! lane of the device taken are launched together, and each answer is the one its lookup gets
//! alone, which is the CPU's.

use std::sync::Barrier;

use datafusion_sparse_knn::cpu::CpuIndex;
use datafusion_sparse_knn::gpu::{GpuIndex, GpuOptions};
use datafusion_sparse_knn::join::{Cancel, JoinIndex, PairList, ProbeOptions, Selection};
use datafusion_sparse_knn::metric::{Metric, MetricKind};

use crate::common::{assert_same_pairs, batch, counts, ranked};

#[test]
#[ignore = "needs a CUDA GPU"]
fn lookups_that_arrive_together_launch_together_and_answer_as_alone() {
    const THREADS: usize = 48;
    const ROUNDS: usize = 6;
    let right = batch(&counts(20_000, 71));
    let left = batch(&counts(THREADS * 2, 72));
    // `None`: within the radius that holds every lookup's 5 nearest.
    let cases = [
        (MetricKind::Cosine, Some(10)),
        (MetricKind::Euclidean, Some(3)),
        (MetricKind::Manhattan, None),
    ];
    for (kind, k) in cases {
        let metric = Metric::from_kind(kind, None, None).unwrap();
        let gpu = GpuIndex::build(&right, &metric, &GpuOptions::default())
            .unwrap_or_else(|e| panic!("{kind:?}: build: {e}"));
        let cpu = CpuIndex::build(&right, &metric);
        let lookup = |i: usize| left.slice(i, 1);
        let selection = match k {
            Some(k) => Selection::Nearest(k),
            None => {
                let nearest = cpu
                    .probe(&left, Selection::Nearest(5), ProbeOptions::default())
                    .unwrap()
                    .into_pairs();
                Selection::Within(nearest.distance.iter().copied().fold(0.0, f64::max))
            }
        };
        // One at a time: each finds a lane free and runs at once.
        let alone: Vec<PairList> = (0..left.len())
            .map(|i| {
                gpu.probe(&lookup(i), selection, ProbeOptions::default())
                    .unwrap()
            })
            .collect();
        assert_eq!(gpu.launches_together(), (0, 0), "{kind:?}: nothing waited");
        for (i, pairs) in alone.iter().enumerate() {
            let want = cpu
                .probe(&lookup(i), selection, ProbeOptions::default())
                .unwrap()
                .into_pairs();
            assert_same_pairs(
                &ranked(pairs),
                &ranked(&want),
                &format!("{kind:?}: lookup {i} alone against the CPU"),
            );
        }
        let found = alone.iter().filter(|p| !p.is_empty()).count();
        assert!(found > left.len() / 2, "{kind:?}: most lookups find rows");

        let start = Barrier::new(THREADS);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (gpu, alone, start, lookup) = (&gpu, &alone, &start, &lookup);
                s.spawn(move || {
                    for round in 0..ROUNDS {
                        start.wait();
                        let i = (t * 2 + round) % (THREADS * 2);
                        let got = gpu
                            .probe_cancellable(
                                &lookup(i),
                                selection,
                                ProbeOptions::default(),
                                &Cancel::new(),
                            )
                            .unwrap()
                            .into_pairs();
                        assert_same_pairs(
                            &ranked(&got),
                            &ranked(&alone[i]),
                            &format!("{kind:?}: lookup {i}, thread {t}, round {round}"),
                        );
                    }
                });
            }
        });
        let (launches, probes) = gpu.launches_together();
        assert!(
            launches > 0 && probes >= 2 * launches,
            "{kind:?}: {THREADS} threads at once, {launches} launches of {probes} lookups"
        );
        assert!(
            probes <= (THREADS * ROUNDS) as u64,
            "{kind:?}: {probes} lookups launched together, of {}",
            THREADS * ROUNDS
        );
    }
}
