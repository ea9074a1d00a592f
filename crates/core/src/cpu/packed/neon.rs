//! The aarch64 NEON product kernel: the AVX2 kernel's structure on 32 registers of four floats.
//!
//! A tile of one or two rows (a decode step) runs in one pass over whole panel rows (`2 x 32`
//! sums in 16 registers beside the 8 of a widened panel row), streaming each weight once;
//! taller tiles run in passes of up to six rows and half a panel's columns (`6 x 16`
//! sums in 24 registers, beside the 4 of a half panel row and one vector of activations), each
//! over the whole block of panel rows, which stays in L1 between passes. bf16 weights widen
//! with one shift or mask per four columns, f16 weights with one `fcvtl` (a conversion, no
//! half-precision arithmetic: every ARMv8 CPU runs it).
//!
//! Speed on aarch64 is not measured here (the project's machines are x86_64; these kernels are
//! checked under qemu, which says nothing of speed): they keep the register budget and loop
//! shape of the AVX2 kernel that was measured, one input an iteration where AVX2 takes four
//! ([`super::half_pass::INPUTS_PER_ITERATION`]), and of the 42 inner loops of the release assembly
//! one spills a sum (see `Neon::half_pass`).

use std::arch::aarch64::*;

use super::half_pass::{
    HalfPanelKernel, HalfPass, for_each_input, run_tile, store_half, store_whole_panel,
};
use super::prefetch::Upcoming;
use super::{Element, PANEL, PanelRow, Tile};
use crate::precision::WeightDtype;

/// Floats in a NEON register.
const LANES: usize = 4;

/// Registers of half a panel row, widened.
const HALF: usize = PANEL / 2 / LANES;

/// The NEON kernel ([`run_tile`] with [`Neon`]). Kept out of line, as the x86 kernels are by
/// their target features: one function a kernel in profiles and in the release assembly, where
/// its spills are counted.
///
/// # Safety
/// As [`run_tile`] (NEON is part of every aarch64 CPU).
#[inline(never)]
pub(super) unsafe fn tile_neon<E: Element>(tile: &Tile<'_, E>, strip: &[f32], height: usize) {
    // SAFETY: the caller's contract.
    unsafe { run_tile::<Neon, E>(tile, strip, height) }
}

/// The NEON half-panel kernel.
struct Neon;

impl HalfPanelKernel for Neon {
    /// A tile of `R` (one or two) rows over whole panel rows: `R x 32` sums in `8R` registers.
    ///
    /// # Safety
    /// As [`run_tile`], with `height == R`.
    unsafe fn whole_panel<const R: usize, E: Element>(tile: &Tile<'_, E>, strip: &[f32]) {
        // SAFETY: NEON is always present on aarch64.
        let mut sums = [[[unsafe { vdupq_n_f32(0.0) }; HALF]; 2]; R];
        for (row, x) in tile.weights.iter().zip(strip.as_chunks::<R>().0) {
            let halves = [widen_half(row, 0), widen_half(row, 1)];
            for (sum, &x) in sums.iter_mut().zip(x) {
                for (sum, weights) in sum.iter_mut().zip(&halves) {
                    for (s, w) in sum.iter_mut().zip(weights) {
                        // SAFETY: NEON is always present on aarch64.
                        *s = unsafe { vfmaq_n_f32(*s, *w, x) };
                    }
                }
            }
        }
        // SAFETY: the caller's contract.
        unsafe { store_whole_panel(sums, tile) }
    }

    /// Rows `first..first + R`, one half panel, of a tile: `R x 16` sums in `4R` registers, one
    /// rank-1 update per input; the passes after a tile's first ask for the task's next block, a
    /// few panel rows a pass, as the AVX2 passes do. Each half is a copy of its own (`WHICH_HALF`,
    /// the pass's `half`), as in the AVX2 kernel: with the half a run-time value, whether LLVM
    /// split the bf16 loop by half (a shift or a mask) was up to its heuristics, and in one build
    /// it did not: the loop computed both widenings and selected one, with 12 spill loads and
    /// stores an input. Now only the six-row pass over a bf16 panel's high half keeps one sum on
    /// the stack (two spill instructions an input, beside 24 multiply-adds): its mask constant
    /// takes the 32nd register. LLVM folds two shifts into the same mask.
    ///
    /// # Safety
    /// As [`run_tile`], with `first + R <= height` and `pass.half == WHICH_HALF`.
    unsafe fn half_pass<'a, const R: usize, const WHICH_HALF: usize, E: Element>(
        tile: &Tile<'a, E>,
        strip: &[f32],
        pass: HalfPass,
        upcoming: &mut Upcoming<'a, E>,
    ) {
        debug_assert_eq!(pass.half, WHICH_HALF);
        // SAFETY: NEON is always present on aarch64.
        let mut sums = [[unsafe { vdupq_n_f32(0.0) }; HALF]; R];
        let opens_tile = pass.opens_tile();
        for_each_input(tile.weights, strip, pass, |row, x: &[f32; R]| {
            if !opens_tile {
                upcoming.step();
            }
            let weights = widen_half(row, WHICH_HALF);
            for (sum, &x) in sums.iter_mut().zip(x) {
                for (s, w) in sum.iter_mut().zip(&weights) {
                    // SAFETY: NEON is always present on aarch64.
                    *s = unsafe { vfmaq_n_f32(*s, *w, x) };
                }
            }
        });
        // SAFETY: the caller's contract.
        unsafe { store_half(sums, tile, pass) }
    }
}

/// Columns `16 * half..16 * half + 16` of a panel row widened to f32, four a register.
#[inline(always)]
fn widen_half<E: Element>(row: &PanelRow<E>, half: usize) -> [float32x4_t; HALF] {
    let bytes = row.0.as_ptr().cast::<u8>();
    // SAFETY: a panel row is 64-byte aligned and holds 32 elements (128 bytes of f32, 64 of
    // bf16/f16), `half` is 0 or 1: every load below stays inside it. NEON is always present.
    unsafe {
        match E::DTYPE {
            WeightDtype::F32 => {
                let at = bytes.add(64 * half).cast::<f32>();
                std::array::from_fn(|v| vld1q_f32(at.add(LANES * v)))
            }
            // Lane `j` holds column `j` in its low half and `16 + j` in its high half
            // (`Element::slot`); a bf16 is the high half of the f32 it rounds.
            WeightDtype::Bf16 => {
                let at = bytes.cast::<u32>();
                std::array::from_fn(|v| {
                    let lanes = vld1q_u32(at.add(LANES * v));
                    vreinterpretq_f32_u32(match half {
                        0 => vshlq_n_u32::<16>(lanes),
                        _ => vandq_u32(lanes, vdupq_n_u32(0xffff_0000)),
                    })
                })
            }
            WeightDtype::F16 => {
                let at = bytes.add(32 * half).cast::<u16>();
                std::array::from_fn(|v| f16_to_f32(vld1_u16(at.add(LANES * v))))
            }
        }
    }
}

/// Four f16 bit patterns widened exactly to f32: one `fcvtl`, which every ARMv8-A CPU has (it
/// converts, it does no half-precision arithmetic). Rust's intrinsic for it takes the unstable
/// `f16` vectors, hence the one instruction of inline assembly. (Widened with integer moves and
/// a multiply by `2^112`, as this kernel first did, the five constants and temporaries pushed
/// f16 passes' sums to the stack: 143 spill loads and stores in 14 of the 20 inner loops of the
/// release assembly, ten instructions a widened register.)
#[inline(always)]
fn f16_to_f32(bits: uint16x4_t) -> float32x4_t {
    let widened: float32x4_t;
    // SAFETY: `fcvtl` reads one vector register and writes another; no memory, no flags.
    unsafe {
        std::arch::asm!(
            "fcvtl {widened:v}.4s, {bits:v}.4h",
            widened = lateout(vreg) widened,
            bits = in(vreg) bits,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    widened
}
