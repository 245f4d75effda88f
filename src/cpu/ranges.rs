//! A probe's left rows shared among its workers. Each worker starts with an equal range of
//! consecutive rows and takes them one at a time from its front; a worker whose range is done
//! takes the back half of the range with the most rows left. So a worker's rows come in runs of
//! consecutive rows, whose pairs go into one list each: a radius join writes hundreds of MB of
//! pairs, and few large lists are written once, in huge pages (see `PairList::with_capacity`),
//! where many small tasks' lists took a page fault per 4 KiB.

use std::sync::atomic::{AtomicU64, Ordering};

/// One worker's range `start..end`, packed in one word (`start` in the low half) so that its
/// owner taking the front and another worker taking the back half never both get a row.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Range(AtomicU64);

fn pack(start: u32, end: u32) -> u64 {
    ((end as u64) << 32) | start as u64
}

fn unpack(word: u64) -> (u32, u32) {
    (word as u32, (word >> 32) as u32)
}

/// The rows `0..rows` of a probe, in one range per worker.
#[derive(Debug)]
pub(crate) struct Ranges {
    ranges: Vec<Range>,
}

impl Ranges {
    /// `rows` (at most `u32::MAX`: left rows are u32 in a pair list) split evenly between
    /// `workers` (at least one).
    pub(crate) fn new(rows: usize, workers: usize) -> Self {
        let rows = u32::try_from(rows).expect("left rows of a probe fit in u32");
        let workers = workers.max(1) as u64;
        let bound = |w: u64| (rows as u64 * w / workers) as u32;
        Ranges {
            ranges: (0..workers)
                .map(|w| Range(AtomicU64::new(pack(bound(w), bound(w + 1)))))
                .collect(),
        }
    }

    pub(crate) fn workers(&self) -> usize {
        self.ranges.len()
    }

    /// The rows left in `worker`'s range.
    pub(crate) fn held(&self, worker: usize) -> usize {
        let (start, end) = unpack(self.ranges[worker].0.load(Ordering::Relaxed));
        end.saturating_sub(start) as usize
    }

    /// The next row of `worker`'s range, which follows the row it returned last unless `steal`
    /// gave the worker a new range in between; `None` once the range is empty.
    pub(crate) fn next(&self, worker: usize) -> Option<usize> {
        let range = &self.ranges[worker].0;
        let mut word = range.load(Ordering::Acquire);
        loop {
            let (start, end) = unpack(word);
            if start >= end {
                return None;
            }
            match range.compare_exchange_weak(
                word,
                pack(start + 1, end),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(start as usize),
                Err(now) => word = now,
            }
        }
    }

    /// For a worker whose range is empty: takes the back half (at least one row) of the range
    /// with the most rows left as the worker's own. False once no range has a row left.
    pub(crate) fn steal(&self, worker: usize) -> bool {
        loop {
            let fullest = self
                .ranges
                .iter()
                .enumerate()
                .filter(|&(w, _)| w != worker)
                .map(|(w, r)| (w, r.0.load(Ordering::Acquire)))
                .max_by_key(|&(_, word)| {
                    let (start, end) = unpack(word);
                    end.saturating_sub(start)
                });
            let Some((victim, word)) = fullest else {
                return false;
            };
            let (start, end) = unpack(word);
            if start >= end {
                return false;
            }
            let middle = start + (end - start) / 2;
            if self.ranges[victim]
                .0
                .compare_exchange(
                    word,
                    pack(start, middle),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                // Nobody else writes an empty range: only its owner refills it.
                self.ranges[worker]
                    .0
                    .store(pack(middle, end), Ordering::Release);
                return true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row is handed out once, each worker's rows in runs of consecutive rows, with
    /// workers on threads of their own taking rows at different speeds (and stealing).
    #[test]
    fn every_row_once_in_runs_of_consecutive_rows() {
        for (rows, workers) in [(0, 3), (1, 4), (5, 8), (1000, 1), (10_000, 4), (777, 3)] {
            let ranges = Ranges::new(rows, workers);
            let runs: Vec<Vec<Vec<usize>>> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..ranges.workers())
                    .map(|w| {
                        let ranges = &ranges;
                        scope.spawn(move || {
                            let mut runs = vec![Vec::new()];
                            loop {
                                match ranges.next(w) {
                                    Some(row) => {
                                        let run: &mut Vec<usize> = runs.last_mut().unwrap();
                                        if let Some(&last) = run.last() {
                                            assert_eq!(row, last + 1, "worker {w}");
                                        }
                                        run.push(row);
                                        // Slower workers: their ranges get stolen from.
                                        for _ in 0..w * 200 {
                                            std::hint::spin_loop();
                                        }
                                    }
                                    None if ranges.steal(w) => runs.push(Vec::new()),
                                    None => return runs,
                                }
                            }
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let mut all: Vec<usize> = runs.iter().flatten().flatten().copied().collect();
            all.sort_unstable();
            assert_eq!(
                all,
                (0..rows).collect::<Vec<_>>(),
                "{rows} rows, {workers} workers"
            );
        }
    }
}
