//! The activations of a product rearranged into the strips its kernels read.
//!
//! Packed once a product, in parallel, before the product's own parallel loop; every task reads
//! the strips of its rows from the one copy. (Strips packed by each thread for its own tasks,
//! reused across them, made products alone 2-10 % faster but whole calls no faster, and kept a
//! copy of every product's activations per thread: left out, see `BENCHMARKS.md`.)

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::precision::MatmulPrecision;

/// Rows one strip holds: the most output rows one kernel call keeps in registers.
pub(super) const TILE_ROWS: usize = 12;

/// How a kernel reads the activations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Layout {
    /// Strips of f32 (rounded to the product's precision).
    F32,
    /// Strips of bf16 pairs.
    #[cfg(target_arch = "x86_64")]
    Bf16Pairs,
    /// bf16 values in the order AMX tiles read them ([`Bf16Rows`]).
    #[cfg(target_arch = "x86_64")]
    Bf16Rows,
}

/// The activations rearranged into strips of `TILE_ROWS` rows, each strip `[units, strip rows]`
/// (the last strip may be narrower), so that a kernel reads its row values for one unit of
/// input from consecutive elements. A unit is one input (f32), or two (bf16 pairs). AMX tiles
/// read the activations in their own order instead ([`Bf16Rows`]).
pub(super) enum Strips {
    F32(Vec<f32>),
    /// Inputs `2i` and `2i + 1` rounded to bf16, in the low and high half; a zero high half
    /// past an odd last input.
    #[cfg(target_arch = "x86_64")]
    Bf16Pairs(Vec<u32>),
    #[cfg(target_arch = "x86_64")]
    Bf16Rows(Bf16Rows),
}

impl Strips {
    /// The activations `x` (`[rows, d_in]` row-major) in `layout`; f32 strips rounded to
    /// `precision`.
    pub(super) fn pack(
        layout: Layout,
        precision: MatmulPrecision,
        x: &[f32],
        rows: usize,
        d_in: usize,
    ) -> Self {
        match (layout, precision) {
            #[cfg(target_arch = "x86_64")]
            (Layout::Bf16Rows, _) => Strips::Bf16Rows(Bf16Rows::pack(x, rows, d_in)),
            #[cfg(target_arch = "x86_64")]
            (Layout::Bf16Pairs, _) => {
                Strips::Bf16Pairs(pack_strips(x, rows, d_in, d_in.div_ceil(2), |row, i| {
                    let bits =
                        |k: usize| row.get(k).map_or(0, |&v| half::bf16::from_f32(v).to_bits());
                    u32::from(bits(2 * i)) | (u32::from(bits(2 * i + 1)) << 16)
                }))
            }
            (Layout::F32, MatmulPrecision::F32) => {
                Strips::F32(pack_strips(x, rows, d_in, d_in, |row, k| row[k]))
            }
            (Layout::F32, MatmulPrecision::Bf16) => {
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
            #[cfg(target_arch = "x86_64")]
            Strips::Bf16Pairs(_) => 2,
            #[cfg(target_arch = "x86_64")]
            Strips::Bf16Rows(_) => 1,
        }
    }

    /// `len` elements from `start`.
    pub(super) fn strip(&self, start: usize, len: usize) -> Strip<'_> {
        match self {
            Strips::F32(values) => Strip::F32(&values[start..][..len]),
            #[cfg(target_arch = "x86_64")]
            Strips::Bf16Pairs(pairs) => Strip::Bf16Pairs(&pairs[start..][..len]),
            #[cfg(target_arch = "x86_64")]
            Strips::Bf16Rows(_) => unreachable!("AMX tiles read `Bf16Rows`, not strips"),
        }
    }
}

/// One tile's activations: `[units, height]`.
#[derive(Clone, Copy)]
pub(super) enum Strip<'a> {
    F32(&'a [f32]),
    /// Read by x86's bf16 pair kernel.
    #[cfg(target_arch = "x86_64")]
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

/// Rows of one step of the AMX kernel: [`Bf16Rows`] holds the activations in groups of them.
#[cfg(target_arch = "x86_64")]
pub(super) const STEP_ROWS: usize = 32;
/// Inputs one AMX tile multiply takes (16 bf16 pairs, a 64-byte tile row): [`Bf16Rows`] pads
/// each row to whole ones.
#[cfg(target_arch = "x86_64")]
pub(super) const STEP_DEPTH: usize = 32;
/// Values of a step's two activation tiles.
#[cfg(target_arch = "x86_64")]
pub(super) const STEP_VALUES: usize = STEP_ROWS * STEP_DEPTH;

/// Activations rounded to bf16 in the order AMX tiles read them: for each group of
/// [`STEP_ROWS`] rows, for each [`STEP_DEPTH`] of inputs, the group's 32 rows of 32 values (the
/// two activation tiles of a step, 2 KiB, contiguous). Rows are padded with zeros to whole
/// groups, inputs to whole `STEP_DEPTH`s.
///
/// The activation tiles' loads (from L2) bound the kernel: left out, a 1024 x 768 x 2048
/// product ran at 1946 GFLOP/s instead of 1156 (two threads). Contiguous steps, one stream
/// where row-major rows put a tile's 16 rows a whole row apart, made it 1210 (one run each).
#[cfg(target_arch = "x86_64")]
pub(super) struct Bf16Rows {
    values: Vec<u16>,
    /// Values of one group of rows.
    group_len: usize,
}

#[cfg(target_arch = "x86_64")]
impl Bf16Rows {
    /// The rows of `x` (`[rows, d_in]` row-major).
    ///
    /// # Panics
    /// Where the CPU lacks AVX-512 BF16 (every CPU with AMX has it).
    fn pack(x: &[f32], rows: usize, d_in: usize) -> Self {
        use std::arch::is_x86_feature_detected as has;
        assert!(has!("avx512f") && has!("avx512bf16"), "AVX-512 BF16");
        let group_len = d_in.div_ceil(STEP_DEPTH).max(1) * STEP_VALUES;
        let mut values = vec![0; rows.div_ceil(STEP_ROWS) * group_len];
        if d_in > 0 {
            values
                .par_chunks_mut(group_len)
                .zip(x.par_chunks(STEP_ROWS * d_in))
                .for_each(|(group, x)| {
                    for (row, x) in x.chunks_exact(d_in).enumerate() {
                        for (chunk, x) in x.chunks(STEP_DEPTH).enumerate() {
                            let at = group[chunk * STEP_VALUES + row * STEP_DEPTH..]
                                .first_chunk_mut()
                                .expect("a step holds STEP_DEPTH values a row");
                            // SAFETY: the CPU has AVX-512 BF16 (asserted above).
                            unsafe { round_to_bf16(x, at) };
                        }
                    }
                });
        }
        Bf16Rows { values, group_len }
    }

    /// The first value of the step of rows `first_row..first_row + STEP_ROWS` (a multiple of
    /// `STEP_ROWS`) at input `depth` (a multiple of `STEP_DEPTH`).
    pub(super) fn step(&self, first_row: usize, depth: usize) -> &[u16] {
        &self.values[first_row / STEP_ROWS * self.group_len + depth / STEP_DEPTH * STEP_VALUES..]
    }
}

/// Writes `x` (at most [`STEP_DEPTH`] values: else a panic) rounded to bf16 (to nearest, ties
/// to even) into the first `x.len()` of `out`'s `STEP_DEPTH` values, zeros after them: one
/// `vcvtne2ps2bf16`, which flushes subnormals to zero, as the tiles would on reading them.
///
/// A scalar rounding here took 5 % of a Llama-shaped 8 x 128 call with bf16 products.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
fn round_to_bf16(x: &[f32], out: &mut [u16; STEP_DEPTH]) {
    let mut padded = [0.0; STEP_DEPTH];
    padded[..x.len()].copy_from_slice(x);
    // SAFETY: the loads read `padded`'s 32 floats, the store writes `out`'s 64 bytes.
    unsafe {
        let rounded = _mm512_cvtne2ps_pbh(
            _mm512_loadu_ps(padded[16..].as_ptr()),
            _mm512_loadu_ps(padded.as_ptr()),
        );
        _mm512_storeu_si512(
            out.as_mut_ptr().cast(),
            std::mem::transmute::<__m512bh, __m512i>(rounded),
        );
    }
}
