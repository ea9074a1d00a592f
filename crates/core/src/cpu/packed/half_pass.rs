//! The pass structure of the half-panel kernels (AVX2, NEON): which rows and half panel a pass
//! computes, and the loop over a pass's inputs.

use super::{Element, PANEL, PanelRow, Start, Tile};

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
    /// memory in a block's first tile); the later ones ask for the next block ([`Upcoming`](super::prefetch::Upcoming)).
    pub(super) fn opens_tile(self) -> bool {
        (self.first, self.half) == (0, 0)
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
