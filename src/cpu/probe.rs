//! Probing the build side with a batch of left rows, on all cores.
//!
//! Per left row, the folded semiring is accumulated over shared columns through the inverted
//! index (a sparse-times-sparse product into a dense accumulator of one value per right row),
//! then every right row is finished and offered to a top-k (or a radius filter). Only k pairs
//! per left row ever exist; the m×n matrix is never materialised.

use rayon::prelude::*;

use super::chebyshev::{chebyshev_row, ChebyshevScratch};
use super::folded::{folded_row, FoldedScratch};
use super::index::CpuIndex;
use super::topk::TopK;
use crate::metric::{with_semiring, MetricKind, Semiring};
use crate::vector::SparseBatch;

/// Pairs produced for one left batch, ordered by left row, then by rank (knn) or right row (radius).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PairList {
    /// Row of the left batch (0-based within the batch).
    pub left: Vec<u32>,
    /// Row of the build side (0-based over all right rows).
    pub right: Vec<u32>,
    pub distance: Vec<f64>,
}

impl PairList {
    pub fn len(&self) -> usize {
        self.left.len()
    }

    pub fn is_empty(&self) -> bool {
        self.left.is_empty()
    }

    /// 1-based rank of each pair within its left row (for knn results).
    pub fn ranks(&self) -> Vec<i32> {
        let mut ranks = Vec::with_capacity(self.len());
        for i in 0..self.len() {
            let r = if i > 0 && self.left[i - 1] == self.left[i] {
                ranks[i - 1] + 1
            } else {
                1
            };
            ranks.push(r);
        }
        ranks
    }

    fn append(&mut self, mut other: PairList) {
        self.left.append(&mut other.left);
        self.right.append(&mut other.right);
        self.distance.append(&mut other.distance);
    }
}

/// What to keep of each left row's distances.
#[derive(Debug, Clone, Copy)]
pub enum Selection {
    Nearest(usize),
    Within(f64),
}

/// How left rows relate to right rows for `exclude_self`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProbeOptions {
    /// When set, the left batch's row `i` sits at position `first_row + i` of the self-joined
    /// input, and the right row at that same position is skipped.
    pub exclude_self_from: Option<u64>,
}

/// Rows per parallel task: small enough to balance skewed degrees across cores.
const ROWS_PER_TASK: usize = 8;

pub fn probe(
    index: &CpuIndex,
    left: &SparseBatch,
    selection: Selection,
    options: ProbeOptions,
) -> PairList {
    let rows = left.len();
    let chunks: Vec<PairList> = (0..rows.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .map_init(
            || Workspace::new(index),
            |ws, chunk| {
                let start = chunk * ROWS_PER_TASK;
                let end = (start + ROWS_PER_TASK).min(rows);
                let mut out = PairList::default();
                for row in start..end {
                    if left.is_null(row) {
                        continue;
                    }
                    let skip = options
                        .exclude_self_from
                        .map(|first| first + row as u64)
                        .filter(|&p| p < index.rows as u64)
                        .map(|p| p as usize);
                    match &index.exact_rows {
                        None => probe_row(
                            index,
                            left.row(row),
                            row as u32,
                            skip,
                            selection,
                            ws,
                            &mut out,
                        ),
                        Some(right) => refined_row(
                            index,
                            right,
                            left.row(row),
                            row as u32,
                            skip,
                            selection,
                            ws,
                            &mut out,
                        ),
                    }
                }
                out
            },
        )
        .collect();
    let mut out = PairList::default();
    for c in chunks {
        out.append(c);
    }
    out
}

/// Extra candidates taken per left row before exact refinement, so that rows the folded form
/// ranks slightly wrong (it cancels) can still make the final k.
const REFINE_EXTRA: usize = 16;

/// Minkowski with p > 1 cancels in its folded form when both rows hold large, nearly equal
/// values (Σ|x|ᵖ + Σ|y|ᵖ dwarfs the true Σ|x−y|ᵖ): the folded probe proposes candidates and each
/// proposed pair is recomputed exactly over the union of the two rows.
#[allow(clippy::too_many_arguments)]
fn refined_row(
    index: &CpuIndex,
    right: &SparseBatch,
    row: (&[i32], &[f32]),
    left_row: u32,
    skip: Option<usize>,
    selection: Selection,
    ws: &mut Workspace,
    out: &mut PairList,
) {
    let mut candidates = PairList::default();
    let wide = match selection {
        Selection::Nearest(k) => Selection::Nearest(k.saturating_add(REFINE_EXTRA)),
        // The folded distance of a pair right at the radius can land just outside it.
        Selection::Within(radius) => Selection::Within(radius * (1.0 + 1e-3) + 1e-9),
    };
    probe_row(index, row, left_row, skip, wide, ws, &mut candidates);
    let mut pairs: Vec<(f64, u32)> = candidates
        .right
        .iter()
        .map(|&j| (index.metric.distance(row, right.row(j as usize)), j))
        .collect();
    match selection {
        Selection::Nearest(k) => {
            pairs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            pairs.truncate(k);
        }
        Selection::Within(radius) => pairs.retain(|&(d, _)| index.metric.within(d, radius)),
    }
    for (d, j) in pairs {
        out.left.push(left_row);
        out.right.push(j);
        out.distance.push(d);
    }
}

/// Per-thread scratch, reused across rows.
struct Workspace {
    folded: FoldedScratch,
    chebyshev: ChebyshevScratch,
    topk: TopK,
}

impl Workspace {
    fn new(index: &CpuIndex) -> Self {
        if index.metric.kind == MetricKind::Chebyshev {
            return Workspace {
                folded: FoldedScratch::default(),
                chebyshev: ChebyshevScratch::new(index),
                topk: TopK::default(),
            };
        }
        let two = with_semiring!(index.metric, s => needs_second(&s));
        Workspace {
            folded: FoldedScratch::new(index.rows, two),
            chebyshev: ChebyshevScratch::default(),
            topk: TopK::default(),
        }
    }
}

fn needs_second<S: Semiring>(_: &S) -> bool {
    S::TWO_ACCUMULATORS
}

/// Whether the folded `pair(x, 0)` is exactly 0 and cheap, so a dense column (zeros where a right
/// row lacks it) can be added without testing each value. For the others a zero must be skipped:
/// their pair assumes both sides nonzero (canberra, the set metrics, kl, js) or is costly enough
/// (powf) that skipping the zeros wins.
fn pair_vanishes(kind: MetricKind) -> bool {
    matches!(
        kind,
        MetricKind::Dot
            | MetricKind::Cosine
            | MetricKind::Euclidean
            | MetricKind::SqEuclidean
            | MetricKind::Correlation
            | MetricKind::Manhattan
            | MetricKind::BrayCurtis
            | MetricKind::Hellinger
    )
}

fn probe_row(
    index: &CpuIndex,
    row: (&[i32], &[f32]),
    left_row: u32,
    skip: Option<usize>,
    selection: Selection,
    ws: &mut Workspace,
    out: &mut PairList,
) {
    let metric = index.metric;
    if metric.kind != MetricKind::Chebyshev {
        let scratch = &mut ws.folded;
        let masked = !pair_vanishes(metric.kind);
        with_semiring!(metric, s => if masked {
            folded_row::<_, true>(&s, index, row, left_row, skip, selection, scratch, out)
        } else {
            folded_row::<_, false>(&s, index, row, left_row, skip, selection, scratch, out)
        });
        return;
    }
    if let Selection::Nearest(k) = selection {
        ws.topk.reset(k);
    }
    let topk = &mut ws.topk;
    let offer = |j: usize, d: f64| match selection {
        Selection::Nearest(_) => topk.push(d, j as u32),
        Selection::Within(radius) => {
            if metric.within(d, radius) {
                out.left.push(left_row);
                out.right.push(j as u32);
                out.distance.push(d);
            }
        }
    };
    chebyshev_row(index, row, skip, &mut ws.chebyshev, offer);
    if let Selection::Nearest(_) = selection {
        for (key, j) in ws.topk.drain_sorted() {
            out.left.push(left_row);
            out.right.push(j);
            out.distance.push(key);
        }
    }
}
