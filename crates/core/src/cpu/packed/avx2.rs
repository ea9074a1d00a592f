//! The AVX2 product kernel (with FMA, and F16C to widen f16 weights): a decode step's one or
//! two rows over whole panel rows, taller tiles in half-panel passes
//! ([`half_pass`](super::half_pass), the structure the NEON kernel shares).

use super::half_pass::{
    HalfPanelKernel, HalfPass, for_each_input, run_tile, store_half, store_whole_panel,
};
use super::prefetch::{Upcoming, prefetch_ahead};
use super::{Element, PanelRow, Tile};
use crate::precision::WeightDtype;

/// The AVX2 kernel ([`run_tile`] with [`Avx2`]).
///
/// # Safety
/// As [`run_tile`]: the CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile_avx2<E: Element>(tile: &Tile<'_, E>, strip: &[f32], height: usize) {
    // SAFETY: the caller's contract.
    unsafe { run_tile::<Avx2, E>(tile, strip, height) }
}

/// The AVX2 half-panel kernel.
struct Avx2;

impl HalfPanelKernel for Avx2 {
    /// A tile of `R` (one or two) rows over whole panel rows: `R x 32` sums in `4R` registers.
    ///
    /// # Safety
    /// As [`run_tile`], with `height == R`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn whole_panel<const R: usize, E: Element>(tile: &Tile<'_, E>, strip: &[f32]) {
        use std::arch::x86_64::*;
        let mut sums = [[[_mm256_setzero_ps(); 2]; 2]; R];
        for (row, x) in tile.weights.iter().zip(strip.as_chunks::<R>().0) {
            prefetch_ahead::<R, E>(row);
            let halves = [widen_half_avx2(row, 0), widen_half_avx2(row, 1)];
            for (sum, &x) in sums.iter_mut().zip(x) {
                let x = _mm256_set1_ps(x);
                for (sum, weights) in sum.iter_mut().zip(&halves) {
                    sum[0] = _mm256_fmadd_ps(x, weights[0], sum[0]);
                    sum[1] = _mm256_fmadd_ps(x, weights[1], sum[1]);
                }
            }
        }
        // SAFETY: the caller's contract.
        unsafe { store_whole_panel(sums, tile) }
    }

    /// Rows `first..first + R`, one half panel, of an AVX2 tile: `R x 16` sums in `2R` registers,
    /// one rank-1 update per input. Only a tile's first pass asks for the panel rows ahead: the
    /// block stays in cache for the passes after it, where a prefetch per input would take load
    /// slots from the broadcasts; those passes ask for the task's next block instead, a few panel
    /// rows a pass ([`Upcoming`]).
    ///
    /// Each half is a copy of its own (`WHICH_HALF`, the pass's `half`). With the half a run-time
    /// value the loop kept both widenings of a bf16 panel row (a shift; a mask and its constant),
    /// which pushed two sums out of the 16 registers to the stack on every input: bf16 weights'
    /// prompt calls took 1.8x f32's (a Llama-shaped 8 x 128-token call, 2078 against 1157 ms on
    /// Zen 4 capped to AVX2; 1136-1246 since, f16 1275 -> 1133, f32 unchanged).
    ///
    /// # Safety
    /// As [`run_tile`], with `first + R <= height` and `pass.half == WHICH_HALF`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half_pass<'a, const R: usize, const WHICH_HALF: usize, E: Element>(
        tile: &Tile<'a, E>,
        strip: &[f32],
        pass: HalfPass,
        upcoming: &mut Upcoming<'a, E>,
    ) {
        use std::arch::x86_64::*;
        debug_assert_eq!(pass.half, WHICH_HALF);
        let mut sums = [[_mm256_setzero_ps(); 2]; R];
        let mut update = |row: &PanelRow<E>, x: &[f32; R]| {
            let [low, high] = widen_half_avx2(row, WHICH_HALF);
            for (sum, &x) in sums.iter_mut().zip(x) {
                let x = _mm256_set1_ps(x);
                sum[0] = _mm256_fmadd_ps(x, low, sum[0]);
                sum[1] = _mm256_fmadd_ps(x, high, sum[1]);
            }
        };
        if pass.opens_tile() {
            // The tile's first pass brings the block (both halves) into L1 for the others.
            for_each_input(tile.weights, strip, pass, |row, x| {
                prefetch_ahead::<R, E>(row);
                update(row, x);
            });
        } else {
            for_each_input(tile.weights, strip, pass, |row, x| {
                upcoming.step();
                update(row, x);
            });
        }
        // SAFETY: the caller's contract.
        unsafe { store_half(sums, tile, pass) }
    }
}

/// Columns `16 * half..16 * half + 16` of a panel row widened to f32, eight a register.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn widen_half_avx2<E: Element>(row: &PanelRow<E>, half: usize) -> [std::arch::x86_64::__m256; 2] {
    use std::arch::x86_64::*;
    let bytes = row.0.as_ptr().cast::<u8>();
    // SAFETY: a panel row is 64-byte aligned and holds 32 elements (128 bytes of f32, 64 of
    // bf16/f16), `half` is 0 or 1: every load below stays inside it, at its alignment.
    unsafe {
        match E::DTYPE {
            WeightDtype::F32 => {
                let at = bytes.add(64 * half);
                [_mm256_load_ps(at.cast()), _mm256_load_ps(at.add(32).cast())]
            }
            // Lane `j` holds column `j` in its low half and `16 + j` in its high half
            // (`Element::slot`); a bf16 is the high half of the f32 it rounds.
            WeightDtype::Bf16 => {
                let lanes = [
                    _mm256_load_si256(bytes.cast()),
                    _mm256_load_si256(bytes.add(32).cast()),
                ];
                let high = _mm256_set1_epi32(0xffff_0000_u32 as i32);
                lanes.map(|v| {
                    _mm256_castsi256_ps(match half {
                        0 => _mm256_slli_epi32::<16>(v),
                        _ => _mm256_and_si256(v, high),
                    })
                })
            }
            WeightDtype::F16 => {
                let at = bytes.add(32 * half);
                [
                    _mm256_cvtph_ps(_mm_load_si128(at.cast())),
                    _mm256_cvtph_ps(_mm_load_si128(at.add(16).cast())),
                ]
            }
        }
    }
}
