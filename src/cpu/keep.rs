//! Which right rows a probe may offer to a left row: the index's rows that are not NULL, less
//! the left row's own (`exclude_self`), less those a right-side filter drops (its
//! [`RowMask`](crate::join::RowMask), folded into the valid flags once a probe, so the loops
//! that read the flags a block at a time read the mask for free).

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
