//! The pass structure of the half-panel kernels (AVX2, NEON): the passes a tile takes
//! ([`run_tile`]), which rows and half panel each computes, the loop over a pass's inputs and
//! the store of its sums.

use super::prefetch::Upcoming;
use super::{Element, PANEL, PanelRow, Start, Tile, store_scalar};
use crate::cpu::vector::Vector;

/// Rows one half pass keeps in registers: `6 x 16` sums (half a panel), in 12 of AVX2's 16
/// vector registers beside the half panel row (2) and one broadcast activation (BLIS' Haswell
/// tile), and in 24 of NEON's 32 beside the half panel row (4) and the activations. A whole
/// panel in one AVX2 pass (`3 x 32`) needs 17 and spilled two sums to the stack; one or two
/// rows fit a whole panel (a decode step then streams each weight once).
pub(super) const PASS_ROWS: usize = 6;

/// A half-panel kernel (AVX2, NEON): its two shapes of tile, each compiled with its rows (and
/// half panel) as constants, which [`run_tile`] picks.
pub(super) trait HalfPanelKernel {
    /// A tile of `R` (one or two) rows over whole panel rows: `R x 32` sums in registers.
    ///
    /// # Safety
    /// As [`run_tile`], with `height == R`.
    unsafe fn whole_panel<const R: usize, E: Element>(tile: &Tile<'_, E>, strip: &[f32]);

    /// Rows `pass.first..pass.first + R`, half panel `WHICH_HALF` (the pass's `half`), of a
    /// tile: `R x 16` sums in registers, one rank-1 update per input.
    ///
    /// # Safety
    /// As [`run_tile`], with `pass.first + R <= pass.height` and `pass.half == WHICH_HALF`.
    unsafe fn half_pass<'a, const R: usize, const WHICH_HALF: usize, E: Element>(
        tile: &Tile<'a, E>,
        strip: &[f32],
        pass: HalfPass,
        upcoming: &mut Upcoming<'a, E>,
    );
}

/// Kernel `K` on a tile of `height` rows: one or two rows (a decode step) in one pass over whole
/// panel rows, streaming each weight once; taller tiles in passes of up to [`PASS_ROWS`] rows
/// and half a panel's columns, each over the whole block of panel rows (which stays in L1
/// between passes).
///
/// # Safety
/// The CPU must have `K`'s instructions, `strip` must hold `tile.weights.len() * height`
/// floats, and `tile.output` must address `height` rows of `tile.columns` writable floats,
/// `tile.stride` apart.
#[inline(always)]
pub(super) unsafe fn run_tile<K: HalfPanelKernel, E: Element>(
    tile: &Tile<'_, E>,
    strip: &[f32],
    height: usize,
) {
    debug_assert_eq!(strip.len(), tile.weights.len() * height);
    // SAFETY (every call): the caller's contract, for the rows each pass names.
    match height {
        1 => return unsafe { K::whole_panel::<1, E>(tile, strip) },
        2 => return unsafe { K::whole_panel::<2, E>(tile, strip) },
        _ => {}
    }
    let mut upcoming = Upcoming::over(tile.upcoming, tile.weights.len());
    for (rows, pass) in HalfPass::all(height, tile.columns, PASS_ROWS) {
        let upcoming = &mut upcoming;
        unsafe {
            match (pass.half, rows) {
                (0, 1) => K::half_pass::<1, 0, E>(tile, strip, pass, upcoming),
                (0, 2) => K::half_pass::<2, 0, E>(tile, strip, pass, upcoming),
                (0, 3) => K::half_pass::<3, 0, E>(tile, strip, pass, upcoming),
                (0, 4) => K::half_pass::<4, 0, E>(tile, strip, pass, upcoming),
                (0, 5) => K::half_pass::<5, 0, E>(tile, strip, pass, upcoming),
                (0, _) => K::half_pass::<PASS_ROWS, 0, E>(tile, strip, pass, upcoming),
                (_, 1) => K::half_pass::<1, 1, E>(tile, strip, pass, upcoming),
                (_, 2) => K::half_pass::<2, 1, E>(tile, strip, pass, upcoming),
                (_, 3) => K::half_pass::<3, 1, E>(tile, strip, pass, upcoming),
                (_, 4) => K::half_pass::<4, 1, E>(tile, strip, pass, upcoming),
                (_, 5) => K::half_pass::<5, 1, E>(tile, strip, pass, upcoming),
                (_, _) => K::half_pass::<PASS_ROWS, 1, E>(tile, strip, pass, upcoming),
            }
        }
    }
}

/// Which part of a tile one pass of a half-panel kernel (AVX2, NEON) computes.
#[derive(Clone, Copy)]
pub(super) struct HalfPass {
    /// The tile's rows (the strip's width).
    pub(super) height: usize,
    /// The pass's first row.
    pub(super) first: usize,
    /// Columns `16 * half..16 * half + 16` of the panel.
    pub(super) half: usize,
}

impl HalfPass {
    /// The passes over a tile of `height` rows and `columns` columns, at most `most_rows` rows
    /// each, in the order the kernels run them (each half panel of the first rows, then of the
    /// next), with the rows each takes.
    pub(super) fn all(
        height: usize,
        columns: usize,
        most_rows: usize,
    ) -> impl Iterator<Item = (usize, HalfPass)> {
        let halves = columns.div_ceil(PANEL / 2);
        (0..height).step_by(most_rows).flat_map(move |first| {
            let rows = (height - first).min(most_rows);
            (0..halves).map(move |half| {
                let pass = HalfPass {
                    height,
                    first,
                    half,
                };
                (rows, pass)
            })
        })
    }

    /// The pass's first `rows` output rows in `tile`, in order: each row's first output in the
    /// half panel, the half's columns the matrix has and what the row's sums add to.
    ///
    /// # Safety
    /// `tile.output` must address rows `first..first + rows` of `tile.columns` writable floats,
    /// `tile.stride` apart.
    #[inline(always)]
    pub(super) unsafe fn output_rows<'a, E>(
        self,
        tile: &Tile<'a, E>,
        rows: usize,
    ) -> impl Iterator<Item = HalfRow<'a>> {
        let offset = self.half * PANEL / 2;
        let columns = tile.columns.saturating_sub(offset).min(PANEL / 2);
        // The half's own columns of the bias.
        let start = match tile.start {
            Start::Bias(bias) => Start::Bias(bias.map(|bias| &bias[offset..offset + columns])),
            Start::Accumulate => Start::Accumulate,
        };
        let (output, stride, first) = (tile.output, tile.stride, self.first);
        (0..rows).map(move |r| HalfRow {
            // SAFETY: row `first + r` of the tile (the caller's contract), from the half's
            // column.
            out: unsafe { output.add((first + r) * stride + offset) },
            columns,
            start,
        })
    }

    /// Whether this is a tile's first pass, the one that reads the tile's block first (from
    /// memory in a block's first tile); the later ones ask for the next block ([`Upcoming`]).
    pub(super) fn opens_tile(self) -> bool {
        (self.first, self.half) == (0, 0)
    }
}

/// Adds a half pass's sums (`R` rows of `N` vectors, half a panel) to their start (bias, zero
/// or the partial sums) and stores them; always inlined into the kernel, whose target features
/// its vectors need.
///
/// # Safety
/// The CPU must have `V`'s instructions, and `tile.output` must address rows
/// `pass.first..pass.first + R` of `tile.columns` writable floats, `tile.stride` apart.
#[inline(always)]
pub(super) unsafe fn store_half<V: Vector, const N: usize, const R: usize, E: Element>(
    sums: [[V; N]; R],
    tile: &Tile<'_, E>,
    pass: HalfPass,
) {
    const { assert!(N * V::LANES == PANEL / 2) };
    // SAFETY: the caller's contract is `output_rows`'.
    let rows = unsafe { pass.output_rows(tile, R) };
    for (
        sum,
        HalfRow {
            out,
            columns,
            start,
        },
    ) in sums.iter().zip(rows)
    {
        if columns == PANEL / 2 {
            for (v, sum) in sum.iter().enumerate() {
                // SAFETY: a whole half panel: 16 writable floats in the row, 16 in the bias;
                // the level's instructions are the caller's contract.
                unsafe {
                    let at = out.add(V::LANES * v);
                    let base = match start {
                        Start::Accumulate => V::load(at),
                        Start::Bias(Some(bias)) => V::load(bias.as_ptr().add(V::LANES * v)),
                        Start::Bias(None) => V::zero(),
                    };
                    sum.add(base).store(at);
                }
            }
        } else {
            // A matrix's last, partial panel: through a buffer, its `columns` values only.
            let mut lanes = [0.0f32; PANEL / 2];
            for (v, sum) in sum.iter().enumerate() {
                // SAFETY: `lanes` holds 16 floats.
                unsafe { sum.store(lanes.as_mut_ptr().add(V::LANES * v)) };
            }
            // SAFETY: `columns` writable floats from `out` (the caller's contract).
            unsafe { store_scalar(out, &lanes[..columns], start) }
        }
    }
}

/// Stores a whole-panel tile's sums (`R` rows of two halves of `N` vectors), a half panel at a
/// time ([`store_half`]).
///
/// # Safety
/// As [`store_half`], for rows `0..R` of the tile.
#[inline(always)]
pub(super) unsafe fn store_whole_panel<V: Vector, const N: usize, const R: usize, E: Element>(
    sums: [[[V; N]; 2]; R],
    tile: &Tile<'_, E>,
) {
    for half in 0..tile.columns.div_ceil(PANEL / 2) {
        let pass = HalfPass {
            height: R,
            first: 0,
            half,
        };
        // SAFETY: the caller's contract.
        unsafe { store_half(sums.map(|sum| sum[half]), tile, pass) }
    }
}

/// One output row of a half pass ([`HalfPass::output_rows`]).
pub(super) struct HalfRow<'a> {
    /// The row's first output in the half panel.
    pub(super) out: *mut f32,
    /// The half panel's columns the matrix has: `PANEL / 2`, fewer in its last panel.
    pub(super) columns: usize,
    /// What the row's sums add to: the half's own columns of the bias, or the output.
    pub(super) start: Start<'a>,
}

/// Inputs [`for_each_input`] takes per loop iteration on x86_64: four. The loop's own counting
/// then takes a quarter of the issue slots it would (on Intel cores those ports also run the
/// multiply-adds: the AVX2 pass ran at 83 % of the FMA peak with an iteration per input, 85-88 %
/// with four).
#[cfg(target_arch = "x86_64")]
pub(super) const INPUTS_PER_ITERATION: usize = 4;

/// Inputs [`for_each_input`] takes per loop iteration on aarch64: one. Four inputs an iteration
/// pushed the NEON passes' sums to the stack (LLVM loads the later inputs' weights and
/// activations early, beside 24 sums in 32 registers): 56 / 193 / 90 spill loads and stores in
/// the inner loops of the f32 / bf16 / f16 passes of the release assembly, none with one input
/// (two: 13 / 12 / 4). aarch64 cores count the loop on their integer pipes, apart from `fmla`'s.
#[cfg(target_arch = "aarch64")]
pub(super) const INPUTS_PER_ITERATION: usize = 1;

/// Calls `step` with each panel row of `weights` and the activations of the pass's `R` rows
/// for the same input, [`INPUTS_PER_ITERATION`] inputs per iteration of one loop, the
/// activations read without a bounds check per input.
///
/// # Panics
/// If the pass's rows do not lie within the strip's width or the strip is shorter than
/// `weights` inputs of it.
#[inline(always)]
pub(super) fn for_each_input<E: Element, const R: usize>(
    weights: &[PanelRow<E>],
    strip: &[f32],
    pass: HalfPass,
    mut step: impl FnMut(&PanelRow<E>, &[f32; R]),
) {
    let HalfPass { height, first, .. } = pass;
    assert!(first + R <= height && strip.len() >= weights.len() * height);
    let values = |input: usize| {
        // SAFETY: `input < weights.len()`, so `input * height + first + R <= strip.len()`
        // (asserted above): the `R` floats lie inside the strip.
        unsafe {
            &*strip
                .as_ptr()
                .add(input * height + first)
                .cast::<[f32; R]>()
        }
    };
    let mut blocks = weights.chunks_exact(INPUTS_PER_ITERATION);
    let mut input = 0;
    for block in blocks.by_ref() {
        for (u, row) in block.iter().enumerate() {
            step(row, values(input + u));
        }
        input += INPUTS_PER_ITERATION;
    }
    for (u, row) in blocks.remainder().iter().enumerate() {
        step(row, values(input + u));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_take_each_half_panel_of_each_row_group_once() {
        let passes: Vec<_> = HalfPass::all(13, 20, 6)
            .map(|(rows, pass)| (rows, pass.first, pass.half))
            .collect();
        assert_eq!(
            passes,
            [
                (6, 0, 0),
                (6, 0, 1),
                (6, 6, 0),
                (6, 6, 1),
                (1, 12, 0),
                (1, 12, 1)
            ]
        );
        // A partial panel of one half, rows fewer than a pass takes.
        let passes: Vec<_> = HalfPass::all(4, 16, 6).map(|(rows, _)| rows).collect();
        assert_eq!(passes, [4]);
    }
}
