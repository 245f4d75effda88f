//! Which vector instructions the CPU kernels run on.
//!
//! The kernels (`folded`, `certified`) are compiled three times: for baseline x86-64, for
//! AVX2+FMA and for AVX-512; the widest the CPU has is chosen once per process. Each lane does the
//! same IEEE operations in every build (Rust neither fuses a multiply and an add nor reorders
//! float operations on its own; the fused multiply-adds written out, as in `math::log_positive`,
//! are rounded once at every width, the baseline build calling libm's `fma`), so every width gives
//! the same bits, only more lanes at once:
//! jensenshannon's logarithm per posting runs on eight lanes instead of four, 1.8x faster.
//! `SPARSE_KNN_CPU_VECTORS=avx2` (or `baseline`) caps the choice, to compare widths on one
//! machine.

use std::sync::OnceLock;

/// An instruction set the kernels are compiled for, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Vectors {
    Baseline,
    /// AVX2 and FMA (256-bit vectors).
    Avx2,
    /// AVX-512 F, DQ and VL with AVX2 and FMA (512-bit vectors).
    Avx512,
}

impl Vectors {
    /// The widest this CPU runs, capped by `SPARSE_KNN_CPU_VECTORS`; chosen once.
    pub(crate) fn chosen() -> Vectors {
        static CHOSEN: OnceLock<Vectors> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let cap = match std::env::var("SPARSE_KNN_CPU_VECTORS") {
                Ok(name) => Vectors::parse(&name).unwrap_or_else(|| {
                    log::warn!(
                        "SPARSE_KNN_CPU_VECTORS={name:?} is none of baseline, avx2, avx512: ignored"
                    );
                    Vectors::Avx512
                }),
                Err(_) => Vectors::Avx512,
            };
            Vectors::detected().min(cap)
        })
    }

    /// The widest this CPU has.
    pub(crate) fn detected() -> Vectors {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                if has!("avx512f") && has!("avx512dq") && has!("avx512vl") {
                    return Vectors::Avx512;
                }
                return Vectors::Avx2;
            }
        }
        Vectors::Baseline
    }

    fn parse(name: &str) -> Option<Vectors> {
        match name.trim().to_ascii_lowercase().as_str() {
            "baseline" | "none" => Some(Vectors::Baseline),
            "avx2" => Some(Vectors::Avx2),
            "avx512" | "avx-512" => Some(Vectors::Avx512),
            _ => None,
        }
    }
}

/// Defines `$name`, which runs `$body` (an `#[inline(always)]` function) compiled for the given
/// [`Vectors`]: one copy per instruction set, each behind `target_feature`, so that the loops
/// inlined into it are vectorised that wide.
macro_rules! multiversion {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident<S: Semiring>($($arg:ident: $ty:ty),* $(,)?) => $body:ident;
    ) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name<S: Semiring>(vectors: $crate::cpu::vectors::Vectors, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2<S: Semiring>($($arg: $ty),*) {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512<S: Semiring>($($arg: $ty),*) {
                    $body($($arg),*)
                }
                // Never wider than the CPU has, whatever the caller asked for.
                match vectors.min($crate::cpu::vectors::Vectors::detected()) {
                    // SAFETY: the CPU has the features each copy is compiled for (checked by
                    // `detected` just above).
                    $crate::cpu::vectors::Vectors::Avx512 => return unsafe { avx512($($arg),*) },
                    $crate::cpu::vectors::Vectors::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::cpu::vectors::Vectors::Baseline => {}
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = vectors;
            $body($($arg),*)
        }
    };
}
pub(crate) use multiversion;
