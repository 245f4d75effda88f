//! A right-side filter as a row mask: `knn_join(q, (SELECT * FROM docs WHERE ...), ...)` probes
//! the index of `docs` (built once, kept) and offers only the rows the predicate passes, instead
//! of building an index of the filtered rows for every predicate.
//!
//! The k nearest among the rows that pass are the first k passing rows in the whole side's
//! (distance, row) order, so any index answers a masked probe exactly: by default
//! ([`probe_masked_by_growing`]) it probes for more than k and drops the rows that fail, asking
//! again with a larger k for the left rows that kept fewer than k; a backend that can skip the
//! failing rows inside its probe (the CPU: `Keep`'s valid flags) overrides
//! [`JoinIndex::probe_masked`](super::JoinIndex::probe_masked).

use arrow::buffer::{BooleanBuffer, Buffer, MutableBuffer};
use arrow::util::bit_util;
use datafusion::common::Result;

use super::backend::{JoinIndex, Probed};
use super::cancel::Cancel;
use super::pairs::PairList;
use super::selection::{ProbeOptions, Selection};
use crate::vector::SparseBatch;

/// Which right rows pass a filter: a bit a row (a filter's Boolean answer as DataFusion gives it,
/// unpacked nowhere: 11M rows are 1.4 MB, handed to the GPU's valid bits as they are), a view of
/// consecutive rows of one mask (a shard of the right side sees its own rows).
#[derive(Debug, Clone)]
pub struct RowMask {
    bits: BooleanBuffer,
    passing: usize,
}

impl RowMask {
    /// The mask of `pass` (one flag a right row, in row order).
    pub fn new(pass: Vec<bool>) -> Self {
        Self::from_bits(BooleanBuffer::from(pass))
    }

    /// The mask whose bit `i` says whether right row `i` passes.
    pub fn from_bits(bits: BooleanBuffer) -> Self {
        let passing = bits.count_set_bits();
        RowMask { bits, passing }
    }

    /// The mask of `len` rows that passes `rows` alone (each below `len`).
    pub fn from_rows(len: usize, rows: &[u32]) -> Self {
        let mut bits = MutableBuffer::from_len_zeroed(len.div_ceil(8));
        for &r in rows {
            bit_util::set_bit(bits.as_slice_mut(), r as usize);
        }
        Self::from_bits(BooleanBuffer::new(bits.into(), 0, len))
    }

    /// Right rows the mask covers.
    pub fn len(&self) -> usize {
        self.bits.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bits.is_empty()
    }

    /// Rows that pass.
    pub fn passing(&self) -> usize {
        self.passing
    }

    /// Whether every row passes (a probe then needs no mask).
    pub fn all_pass(&self) -> bool {
        self.passing == self.len()
    }

    /// The bits, one a row of the view.
    pub fn bits(&self) -> &BooleanBuffer {
        &self.bits
    }

    /// Whether right row `row` (of the view) passes.
    pub fn allows(&self, row: usize) -> bool {
        self.bits.value(row)
    }

    /// Rows `first..first + len` of the view, as a mask of their own (a shard's rows).
    pub fn slice(&self, first: usize, len: usize) -> RowMask {
        Self::from_bits(self.bits.slice(first, len))
    }

    /// Rows `first..first + len` as 32-bit words, row `first + 32 w + b` at bit `b` of word `w`
    /// and no bit set past the last row (the GPU kernels' valid bits).
    pub fn words(&self, first: usize, len: usize) -> Vec<u32> {
        bit_words(&self.bits.slice(first, len))
    }

    /// Bytes a mask holds.
    pub fn memory_size(&self) -> usize {
        self.len().div_ceil(8)
    }
}

/// `bits` as 32-bit words, bit `i` at bit `i % 32` of word `i / 32`, no bit set past the last
/// (the GPU kernels' valid bits).
pub(crate) fn bit_words(bits: &BooleanBuffer) -> Vec<u32> {
    let len = bits.len();
    // (zero-copy where the offset is a multiple of 8)
    let packed = bits.sliced();
    let bytes = packed.as_slice();
    let mut words: Vec<u32> = Vec::with_capacity(len.div_ceil(32));
    // Whole words in a loop the compiler turns into copies, not a copy of a variable length (a
    // call) per word: 11M rows are 344K words.
    let mut whole = bytes.chunks_exact(4);
    words.extend(
        whole
            .by_ref()
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])),
    );
    let rest = whole.remainder();
    if !rest.is_empty() {
        let mut le = [0u8; 4];
        le[..rest.len()].copy_from_slice(rest);
        words.push(u32::from_le_bytes(le));
    }
    words.truncate(len.div_ceil(32));
    if !len.is_multiple_of(32) {
        if let Some(last) = words.last_mut() {
            *last &= (1u32 << (len % 32)) - 1;
        }
    }
    words
}

/// The `len` bits that `words` hold as [`bit_words`] lays them out (a kernel's answer), without
/// a copy on a little-endian host.
pub fn bits_from_words(mut words: Vec<u32>, len: usize) -> BooleanBuffer {
    for word in &mut words {
        *word = word.to_le();
    }
    BooleanBuffer::new(Buffer::from_vec(words), 0, len)
}

/// A masked probe by any index, exact: within a radius, the probe's pairs less the rows that
/// fail; for the k nearest, a probe for about k / (share that passes) rows, then again with four
/// times as many for the left rows that kept fewer than k, until each has k or has seen every
/// row. Pairs come in left row order, then rank.
pub fn probe_masked_by_growing<I: JoinIndex + ?Sized>(
    index: &I,
    left: &SparseBatch,
    selection: Selection,
    options: ProbeOptions,
    mask: &RowMask,
    cancel: &Cancel,
) -> Result<Probed> {
    if mask.all_pass() {
        return index.probe_cancellable(left, selection, options, cancel);
    }
    let k = match selection {
        Selection::Within(_) => {
            let mut probed = index.probe_cancellable(left, selection, options, cancel)?;
            for part in &mut probed.parts {
                *part = kept(part, mask);
            }
            return Ok(probed);
        }
        Selection::Nearest(k) => k,
    };
    let n = mask.len();
    let mut probed = Probed::default();
    if mask.passing() == 0 || k == 0 {
        probed.parts.push(PairList::default());
        return Ok(probed);
    }
    // Expected rows to ask for, with room for an uneven spread of the passing rows.
    let expected = k.saturating_mul(n).div_ceil(mask.passing());
    let mut ask = expected
        .saturating_add(expected / 4)
        .saturating_add(16)
        .min(n);
    let mut answers: Vec<Vec<(u32, f64)>> = vec![Vec::new(); left.len()];
    let mut pending: Vec<usize> = (0..left.len()).filter(|&r| !left.is_null(r)).collect();
    let mut first_round = true;
    while !pending.is_empty() {
        // The first round probes the batch as it is; later ones gather the rows still short, whose
        // own rows (exclude_self) are then left out here rather than by the probe.
        let (batch, probe_options, asked) = if first_round {
            (left.clone(), options, ask)
        } else {
            let rows = left.gather(&pending);
            let extra = usize::from(options.exclude_self_from.is_some());
            (rows, ProbeOptions::default(), (ask + extra).min(n))
        };
        let parts = probed.absorb(index.probe_cancellable(
            &batch,
            Selection::Nearest(asked),
            probe_options,
            cancel,
        )?);
        let pairs = PairList::concat(parts);
        let mut found: Vec<Vec<(u32, f64)>> = vec![Vec::new(); pending.len()];
        for i in 0..pairs.len() {
            let at = pairs.left[i] as usize;
            let row = if first_round { at } else { pending[at] };
            let slot = if first_round {
                pending.binary_search(&row).ok()
            } else {
                Some(at)
            };
            if let Some(slot) = slot {
                found[slot].push((pairs.right[i], pairs.distance[i]));
            }
        }
        let mut still = Vec::new();
        for (slot, row) in pending.iter().copied().enumerate() {
            let seen = found[slot].len();
            let own = if first_round {
                None
            } else {
                options.excluded_right_row(row, n)
            };
            let passing: Vec<(u32, f64)> = found[slot]
                .iter()
                .copied()
                .filter(|&(r, _)| mask.allows(r as usize) && own != Some(r as usize))
                .take(k)
                .collect();
            if passing.len() >= k || seen < asked || asked >= n {
                answers[row] = passing;
            } else {
                still.push(row);
            }
        }
        pending = still;
        first_round = false;
        ask = ask.saturating_mul(4).min(n);
    }
    let mut pairs = PairList::with_capacity(answers.iter().map(Vec::len).sum());
    for (row, answer) in answers.into_iter().enumerate() {
        for (right, distance) in answer {
            pairs.push(row as u32, right, distance);
        }
    }
    probed.parts = vec![pairs];
    Ok(probed)
}

/// The pairs whose right row passes.
fn kept(pairs: &PairList, mask: &RowMask) -> PairList {
    let mut out = PairList::with_capacity(pairs.len());
    for i in 0..pairs.len() {
        if mask.allows(pairs.right[i] as usize) {
            out.push(pairs.left[i], pairs.right[i], pairs.distance[i]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(n: usize, pass: impl Fn(usize) -> bool) -> Vec<bool> {
        (0..n).map(pass).collect()
    }

    #[test]
    fn words_become_the_mask_bits_they_hold() {
        let bits = bits_from_words(vec![0b1011, 1 << 31, 1], 65);
        let set: Vec<usize> = bits.set_indices().collect();
        assert_eq!(set, vec![0, 1, 3, 63, 64]);
        // And back: the words of those bits are the words.
        assert_eq!(bit_words(&bits), vec![0b1011, 1 << 31, 1]);
    }

    #[test]
    fn words_hold_each_rows_bit_and_nothing_past_the_last_row() {
        let pass = flags(1000, |i| i % 7 == 3 || i % 11 == 0);
        let mask = RowMask::new(pass.clone());
        assert_eq!(mask.passing(), pass.iter().filter(|&&p| p).count());
        // Views that start on and off a byte and a word, and end mid-word.
        for (first, len) in [
            (0, 1000),
            (0, 64),
            (3, 61),
            (31, 500),
            (64, 936),
            (999, 1),
            (5, 0),
        ] {
            let words = mask.words(first, len);
            assert_eq!(words.len(), len.div_ceil(32), "view {first}+{len}");
            for (r, &expected) in pass[first..first + len].iter().enumerate() {
                let got = words[r / 32] >> (r % 32) & 1 == 1;
                assert_eq!(got, expected, "view {first}+{len}, row {r}");
            }
            let set: u32 = words.iter().map(|w| w.count_ones()).sum();
            let expected = pass[first..first + len].iter().filter(|&&p| p).count();
            assert_eq!(
                set as usize, expected,
                "bits past the view's last row, {first}+{len}"
            );
        }
    }

    #[test]
    fn a_slice_and_a_mask_of_rows_count_and_answer_like_the_flags() {
        let pass = flags(300, |i| i % 5 == 0);
        let mask = RowMask::new(pass.clone());
        let shard = mask.slice(101, 150);
        assert_eq!(shard.len(), 150);
        assert_eq!(shard.passing(), (101..251).filter(|i| i % 5 == 0).count());
        assert!((0..150).all(|r| shard.allows(r) == pass[101 + r]));

        let rows = RowMask::from_rows(70, &[0, 9, 63, 64, 69]);
        assert_eq!(rows.passing(), 5);
        assert!((0..70).all(|r| rows.allows(r) == [0, 9, 63, 64, 69].contains(&r)));
        assert!(!rows.all_pass());
        assert!(RowMask::new(vec![true; 9]).all_pass());
        assert_eq!(RowMask::from_rows(0, &[]).len(), 0);
    }
}
