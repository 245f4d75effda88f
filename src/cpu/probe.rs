//! Probing the build side with a batch of left rows, on all cores.
//!
//! Per left row, the folded semiring is accumulated over shared columns through the inverted
//! index (a sparse-times-sparse product into a dense accumulator of one value per right row),
//! then every right row is finished and offered to a top-k (or a radius filter). Only k pairs
//! per left row ever exist; the m×n matrix is never materialised.

use rayon::prelude::*;

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
                    probe_row(
                        index,
                        left.row(row),
                        row as u32,
                        skip,
                        selection,
                        ws,
                        &mut out,
                    );
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

/// Per-thread scratch, reused across rows.
struct Workspace {
    folded: FoldedScratch,
    topk: TopK,
    // Chebyshev: the left row scattered over column ids, and a stamp per column.
    dense: Vec<f32>,
    left_stamp: Vec<u32>,
    hit_stamp: Vec<u64>,
    stamp: u32,
    hit: u64,
    sorted: Vec<(u32, f32)>,
}

impl Workspace {
    fn new(index: &CpuIndex) -> Self {
        let cheb = index.metric.kind == MetricKind::Chebyshev;
        let folded = if cheb {
            FoldedScratch::default()
        } else {
            let two = with_semiring!(index.metric, s => needs_second(&s));
            FoldedScratch::new(index.rows, two)
        };
        Workspace {
            folded,
            topk: TopK::default(),
            dense: if cheb {
                vec![0.0; index.column_count]
            } else {
                Vec::new()
            },
            left_stamp: if cheb {
                vec![0; index.column_count]
            } else {
                Vec::new()
            },
            hit_stamp: if cheb {
                vec![0; index.column_count]
            } else {
                Vec::new()
            },
            stamp: 0,
            hit: 0,
            sorted: Vec::new(),
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
    let mut offer = |j: usize, d: f64, ws_topk: &mut TopK| match selection {
        Selection::Nearest(_) => ws_topk.push(d, j as u32),
        Selection::Within(radius) => {
            if metric.within(d, radius) {
                out.left.push(left_row);
                out.right.push(j as u32);
                out.distance.push(d);
            }
        }
    };
    chebyshev_row(index, row, skip, ws, &mut offer);
    if let Selection::Nearest(_) = selection {
        for (key, j) in ws.topk.drain_sorted() {
            out.left.push(left_row);
            out.right.push(j);
            out.distance.push(key);
        }
    }
}

#[inline(never)]
fn chebyshev_row(
    index: &CpuIndex,
    (indices, values): (&[i32], &[f32]),
    skip: Option<usize>,
    ws: &mut Workspace,
    offer: &mut impl FnMut(usize, f64, &mut TopK),
) {
    ws.stamp = ws.stamp.wrapping_add(1);
    if ws.stamp == 0 {
        ws.left_stamp.fill(0);
        ws.stamp = 1;
    }
    // Left nonzeros on columns the right side never uses are never matched: a constant term.
    let mut outside = 0.0f64;
    ws.sorted.clear();
    for (&c, &x) in indices.iter().zip(values) {
        if x == 0.0 {
            continue;
        }
        match index.columns.get(c) {
            Some(col) => {
                ws.dense[col as usize] = x;
                ws.left_stamp[col as usize] = ws.stamp;
                ws.sorted.push((col, x.abs()));
            }
            None => outside = outside.max(x.abs() as f64),
        }
    }
    // Largest |x| first: the max over left-only columns is the first one a right row misses.
    ws.sorted.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
    for j in 0..index.rows {
        if !index.valid[j] || skip == Some(j) {
            continue;
        }
        ws.hit += 1;
        let mut m = outside;
        for p in index.row_ptr[j]..index.row_ptr[j + 1] {
            let col = index.row_cols[p] as usize;
            let y = index.row_vals[p] as f64;
            if ws.left_stamp[col] == ws.stamp {
                m = m.max((ws.dense[col] as f64 - y).abs());
                ws.hit_stamp[col] = ws.hit;
            } else {
                m = m.max(y.abs());
            }
        }
        if let Some(&(_, ax)) = ws
            .sorted
            .iter()
            .find(|(col, _)| ws.hit_stamp[*col as usize] != ws.hit)
        {
            m = m.max(ax as f64);
        }
        offer(j, m, &mut ws.topk);
    }
}
