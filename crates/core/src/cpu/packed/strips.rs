//! The activations of a product rearranged into the strips its kernels read.
//!
//! Packed once a product, in parallel, before the product's own parallel loop; every task reads
//! the strips of its rows from the one copy. (Strips packed by each thread for its own tasks,
//! reused across them, made products alone 2-10 % faster but whole calls no faster, and kept a
//! copy of every product's activations per thread: left out, see `BENCHMARKS.md`.)

use rayon::prelude::*;

use crate::precision::MatmulPrecision;

/// Rows one strip holds: the most output rows one kernel call keeps in registers.
pub(super) const TILE_ROWS: usize = 12;

/// The activations rearranged into strips of `TILE_ROWS` rows, each strip `[units, strip rows]`
/// (the last strip may be narrower), so that a kernel reads its row values for one unit of
/// input from consecutive elements. A unit is one input (f32), or two (bf16 pairs).
pub(super) enum Strips {
    F32(Vec<f32>),
    /// Inputs `2i` and `2i + 1` rounded to bf16, in the low and high half; a zero high half
    /// past an odd last input.
    Bf16Pairs(Vec<u32>),
}

impl Strips {
    /// The strips of `x` (`[rows, d_in]` row-major), as bf16 pairs when `pairs` (the kernel
    /// that reads them takes two inputs a lane), else as f32 rounded to `precision`.
    pub(super) fn pack(
        pairs: bool,
        precision: MatmulPrecision,
        x: &[f32],
        rows: usize,
        d_in: usize,
    ) -> Self {
        match (pairs, precision) {
            (true, _) => {
                Strips::Bf16Pairs(pack_strips(x, rows, d_in, d_in.div_ceil(2), |row, i| {
                    let bits =
                        |k: usize| row.get(k).map_or(0, |&v| half::bf16::from_f32(v).to_bits());
                    u32::from(bits(2 * i)) | (u32::from(bits(2 * i + 1)) << 16)
                }))
            }
            (false, MatmulPrecision::F32) => {
                Strips::F32(pack_strips(x, rows, d_in, d_in, |row, k| row[k]))
            }
            (false, MatmulPrecision::Bf16) => {
                Strips::F32(pack_strips(x, rows, d_in, d_in, |row, k| {
                    half::bf16::from_f32(row[k]).to_f32()
                }))
            }
        }
    }

    /// Inputs per unit.
    pub(super) fn inputs_per_unit(&self) -> usize {
        match self {
            Strips::F32(_) => 1,
            Strips::Bf16Pairs(_) => 2,
        }
    }

    /// `len` elements from `start`.
    pub(super) fn strip(&self, start: usize, len: usize) -> Strip<'_> {
        match self {
            Strips::F32(values) => Strip::F32(&values[start..][..len]),
            Strips::Bf16Pairs(pairs) => Strip::Bf16Pairs(&pairs[start..][..len]),
        }
    }
}

/// One tile's activations: `[units, height]`.
#[derive(Clone, Copy)]
pub(super) enum Strip<'a> {
    F32(&'a [f32]),
    // Read by x86's bf16 pair kernel only.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Bf16Pairs(&'a [u32]),
}

/// Strips of `units` values per row, where `unit(row, u)` is unit `u` of an activation row.
///
/// Each strip's rows are found once, and a whole strip's row loop has a constant height: found
/// anew for each value, the rows made packing cost 0.66-1.40 ns a value on one thread (six
/// runs), now 0.30-1.14 (best 0.30); Llama-shaped 128-token calls 1.5 % faster.
fn pack_strips<T: Copy + Default + Send + Sync>(
    x: &[f32],
    rows: usize,
    d_in: usize,
    units: usize,
    unit: impl Fn(&[f32], usize) -> T + Sync,
) -> Vec<T> {
    let mut strips = vec![T::default(); rows * units];
    if units == 0 {
        return strips;
    }
    strips
        .par_chunks_mut(TILE_ROWS * units)
        .zip(x.par_chunks(TILE_ROWS * d_in))
        .for_each(|(strip, x_rows)| {
            let mut rows = [&[][..]; TILE_ROWS];
            for (slot, row) in rows.iter_mut().zip(x_rows.chunks_exact(d_in)) {
                *slot = row;
            }
            match strip.len() / units {
                TILE_ROWS => fill_strip(strip, &rows, &unit),
                height => fill_strip(strip, &rows[..height], &unit),
            }
        });
    strips
}

/// Writes unit `u` of every row of `rows` (`rows.len()` values) for each `u` in turn into
/// `strip`.
#[inline(always)]
fn fill_strip<T>(strip: &mut [T], rows: &[&[f32]], unit: impl Fn(&[f32], usize) -> T) {
    for (column, u) in strip.chunks_exact_mut(rows.len()).zip(0usize..) {
        for (value, row) in column.iter_mut().zip(rows) {
            *value = unit(row, u);
        }
    }
}
