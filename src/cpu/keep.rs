//! Which right rows a probe may offer to a left row: the index's rows that are not NULL, less
//! the left row's own (`exclude_self`), less those a right-side filter drops (its
//! [`RowMask`](crate::join::RowMask), folded into the valid flags once a probe, so the loops
//! that read the flags a block at a time read the mask for free).

use rayon::prelude::*;

use crate::join::RowMask;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Keep<'a> {
    /// One flag a right row: not NULL, and passing the filter where there is one.
    pub(crate) valid: &'a [bool],
    /// The right row at the left row's own position (exclude_self).
    pub(crate) skip: Option<usize>,
}

impl Keep<'_> {
    #[inline(always)]
    pub(crate) fn allows(&self, j: usize) -> bool {
        self.valid[j] & (self.skip != Some(j))
    }
}

/// The valid flags less the rows `mask` drops, for one masked probe: a 64-row word of the mask
/// at a time, a slice of rows per core (a row's bit read one by one cost a 1M-row side more
/// than a millisecond of one core).
pub(crate) fn masked_valid(valid: &[bool], mask: &RowMask) -> Vec<bool> {
    // Rows a core folds at once: a multiple of 64, so each slice starts on a word.
    const SLICE: usize = 1 << 16;
    let bits = mask.bits();
    let mut out = valid.to_vec();
    out.par_chunks_mut(SLICE)
        .enumerate()
        .for_each(|(i, flags)| {
            let words = bits.slice(i * SLICE, flags.len());
            let words = words.bit_chunks();
            let mut runs = flags.chunks_mut(64);
            for (word, run) in words.iter().zip(&mut runs) {
                fold_word(run, word);
            }
            if let Some(last) = runs.next() {
                fold_word(last, words.remainder_bits());
            }
        });
    out
}

/// Clears each flag of `run` (up to 64) whose bit of `word` is not set.
#[inline(always)]
fn fold_word(run: &mut [bool], word: u64) {
    for (b, flag) in run.iter_mut().enumerate() {
        *flag &= (word >> b) & 1 != 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row counts around the word and slice edges, a mask and valid flags of no pattern: each
    /// flag is the row's valid flag and its bit.
    #[test]
    fn masked_flags_are_valid_and_passing_row_by_row() {
        for rows in [
            0,
            1,
            63,
            64,
            65,
            1000,
            (1 << 16) - 1,
            1 << 16,
            (1 << 16) + 70,
            200_003,
        ] {
            let valid: Vec<bool> = (0..rows).map(|r| (r * 7919) % 13 != 0).collect();
            let pass: Vec<bool> = (0..rows).map(|r| (r * 104_729 + r / 3) % 5 < 2).collect();
            let mask = RowMask::new(pass.clone());
            let folded = masked_valid(&valid, &mask);
            let wanted: Vec<bool> = valid.iter().zip(&pass).map(|(&v, &p)| v & p).collect();
            assert_eq!(folded, wanted, "{rows} rows");
        }
    }
}
