//! The activations of a product rearranged into the strips its kernels read.
//!
//! Packed once a product, in parallel, before the product's own parallel loop; every task reads
//! the strips of its rows from the one copy. (Strips packed by each thread for its own tasks,
//! reused across them, made products alone 2-10 % faster but whole calls no faster, and kept a
//! copy of every product's activations per thread: left out, see `BENCHMARKS.md`.)

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::cpu::host::parallel_output;
use crate::cpu::isa::per_vector_level;
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
                use std::arch::is_x86_feature_detected as has;
                assert!(has!("avx512f") && has!("avx512bf16"), "AVX-512 BF16");
                Strips::Bf16Pairs(pack_strips(
                    x,
                    rows,
                    d_in,
                    d_in.div_ceil(2),
                    |strip, rows, scratch| {
                        // SAFETY: the CPU has AVX-512 BF16 (asserted above).
                        let round = |row: &[f32], pairs: &mut [u32]| unsafe {
                            round_to_bf16_pairs(row, pairs)
                        };
                        convert_and_transpose(strip, rows, scratch, round)
                    },
                ))
            }
            (Layout::F32, MatmulPrecision::F32) => {
                Strips::F32(pack_strips(x, rows, d_in, d_in, |strip, rows, _| {
                    transpose(strip, rows)
                }))
            }
            (Layout::F32, MatmulPrecision::Bf16) => {
                Strips::F32(pack_strips(x, rows, d_in, d_in, |strip, rows, scratch| {
                    convert_and_transpose(strip, rows, scratch, round_to_bf16_values)
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

/// Strips of `units` values per activation row, in parallel: `fill(strip, rows, scratch)` writes
/// one strip (`[units, rows.len()]`) from its activation rows, with an empty scratch buffer of
/// its own (the rounding paths fill it; a strip's worth, allocated once a strip).
fn pack_strips<T: Copy + Default + Send + Sync>(
    x: &[f32],
    rows: usize,
    d_in: usize,
    units: usize,
    fill: impl Fn(&mut [T], &[&[f32]], &mut Vec<T>) + Sync,
) -> Vec<T> {
    if units == 0 {
        return vec![T::default(); rows * units];
    }
    parallel_output(rows * units, TILE_ROWS * units, |task, strip| {
        let x_rows = &x[task * TILE_ROWS * d_in..][..strip.len() / units * d_in];
        let mut rows = [&[][..]; TILE_ROWS];
        for (slot, row) in rows.iter_mut().zip(x_rows.chunks_exact(d_in)) {
            *slot = row;
        }
        fill(strip, &rows[..strip.len() / units], &mut Vec::new());
    })
}

/// Converts each of `rows` with `convert` (a row, its `units` values) into `scratch`, then
/// transposes them into `strip`: each row converted whole, where the compiler or one instruction
/// converts many values at once (converted one value at a time as the strip was written, bf16
/// rounding took 4.7 % of a Llama-shaped 8 x 128 call with bf16 products on Zen 4).
fn convert_and_transpose<T: Copy + Default>(
    strip: &mut [T],
    rows: &[&[f32]],
    scratch: &mut Vec<T>,
    convert: impl Fn(&[f32], &mut [T]),
) {
    let units = strip.len() / rows.len();
    scratch.resize(rows.len() * units, T::default());
    let mut converted = [&[][..]; TILE_ROWS];
    for ((slot, out), row) in converted
        .iter_mut()
        .zip(scratch.chunks_exact_mut(units))
        .zip(rows)
    {
        convert(row, out);
        *slot = out;
    }
    transpose(strip, &converted[..rows.len()]);
}

/// Writes value `u` of every row of `rows` for each `u` in turn into `strip`
/// (`[units, rows.len()]`).
///
/// A whole strip's row loop has a constant height: with the height found anew for each value,
/// packing cost 0.66-1.40 ns a value on one thread (six runs), with a constant one 0.30-1.14
/// (best 0.30); Llama-shaped 128-token calls 1.5 % faster.
fn transpose<T: Copy>(strip: &mut [T], rows: &[&[T]]) {
    /// The loop, inlined into each height's call.
    #[inline(always)]
    fn columns<T: Copy>(strip: &mut [T], rows: &[&[T]]) {
        for (column, u) in strip.chunks_exact_mut(rows.len()).zip(0usize..) {
            for (value, row) in column.iter_mut().zip(rows) {
                *value = row[u];
            }
        }
    }
    match <&[&[T]; TILE_ROWS]>::try_from(rows) {
        Ok(whole) => columns(strip, whole),
        Err(_) => columns(strip, rows),
    }
}

per_vector_level! {
    /// `row` rounded to bf16 (to nearest, ties to even), back in f32, into `out`: written
    /// without branches, for the compiler to vectorise at each vector level (`half`'s rounding,
    /// the same one a value at a time, branches on NaN and on the rounding bit).
    fn round_to_bf16_values(row: &[f32], out: &mut [f32]) {
        for (out, &value) in out.iter_mut().zip(row) {
            *out = bf16_rounded(value);
        }
    }
}

/// `value` rounded to bf16 (to nearest, ties to even; a NaN stays a quiet NaN), back in f32:
/// what `half::bf16::from_f32(value).to_f32()` gives, without a branch.
#[inline(always)]
fn bf16_rounded(value: f32) -> f32 {
    let bits = value.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1));
    let nan = bits & 0x7fff_ffff > 0x7f80_0000;
    f32::from_bits(if nan { bits | 0x0040_0000 } else { rounded } & 0xffff_0000)
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
        let groups = rows.div_ceil(STEP_ROWS);
        let values = parallel_output(groups * group_len, group_len, |task, group| {
            let x =
                &x[task * STEP_ROWS * d_in..][..(rows - task * STEP_ROWS).min(STEP_ROWS) * d_in];
            for (row, x) in x.chunks_exact(d_in.max(1)).enumerate() {
                for (chunk, x) in x.chunks(STEP_DEPTH).enumerate() {
                    let at = group[chunk * STEP_VALUES + row * STEP_DEPTH..]
                        .first_chunk_mut()
                        .expect("a step holds STEP_DEPTH values a row");
                    // SAFETY: the CPU has AVX-512 BF16 (asserted above).
                    unsafe { round_to_bf16(x, at) };
                }
            }
        });
        Bf16Rows { values, group_len }
    }

    /// The first value of the step of rows `first_row..first_row + STEP_ROWS` (a multiple of
    /// `STEP_ROWS`) at input `depth` (a multiple of `STEP_DEPTH`).
    pub(super) fn step(&self, first_row: usize, depth: usize) -> &[u16] {
        &self.values[first_row / STEP_ROWS * self.group_len + depth / STEP_DEPTH * STEP_VALUES..]
    }
}

/// Values one `vcvtne2ps2bf16` rounds.
#[cfg(target_arch = "x86_64")]
const ROUNDED_AT_ONCE: usize = 32;

/// `x` (at most [`ROUNDED_AT_ONCE`] values: else a panic) rounded to bf16 (to nearest, ties to
/// even) in order, zeros after them: one `vcvtne2ps2bf16`, which flushes subnormals to zero, as
/// AMX tiles and `vdpbf16ps` would on reading them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
fn rounded_to_bf16(x: &[f32]) -> __m512i {
    assert!(x.len() <= ROUNDED_AT_ONCE, "at most 32 values");
    // Masked loads: the lanes past `x` read nothing and are zero (a copy into a padded buffer
    // was a `memcpy` call per step, 4 % of a Llama-shaped 8 x 128 call with bf16 products).
    let (low, high) = x.split_at(x.len().min(16));
    let mask = |values: &[f32]| ((1u32 << values.len()) - 1) as __mmask16;
    // SAFETY: each load reads only the lanes its mask selects, all inside `x`; `__m512bh` is
    // 512 bits, any bits.
    unsafe {
        let rounded = _mm512_cvtne2ps_pbh(
            _mm512_maskz_loadu_ps(mask(high), high.as_ptr()),
            _mm512_maskz_loadu_ps(mask(low), low.as_ptr()),
        );
        std::mem::transmute::<__m512bh, __m512i>(rounded)
    }
}

/// Writes `x` (at most [`STEP_DEPTH`] values) rounded to bf16 into the first `x.len()` of
/// `out`'s `STEP_DEPTH` values, zeros after them ([`rounded_to_bf16`]).
///
/// A scalar rounding here took 5 % of a Llama-shaped 8 x 128 call with bf16 products.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
fn round_to_bf16(x: &[f32], out: &mut [u16; STEP_DEPTH]) {
    const _: () = assert!(STEP_DEPTH == ROUNDED_AT_ONCE);
    // SAFETY: the store writes `out`'s 64 bytes.
    unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), rounded_to_bf16(x)) }
}

/// `row` rounded to bf16 as input pairs: inputs `2i` and `2i + 1` in the low and high half of
/// `pairs[i]` (`row.len().div_ceil(2)` of them), a zero high half past an odd last input
/// ([`rounded_to_bf16`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
fn round_to_bf16_pairs(row: &[f32], pairs: &mut [u32]) {
    const PAIRS_AT_ONCE: usize = ROUNDED_AT_ONCE / 2;
    for (x, pairs) in row
        .chunks(ROUNDED_AT_ONCE)
        .zip(pairs.chunks_mut(PAIRS_AT_ONCE))
    {
        let mut all = [0u32; PAIRS_AT_ONCE];
        // SAFETY: the store writes `all`'s 64 bytes.
        unsafe { _mm512_storeu_si512(all.as_mut_ptr().cast(), rounded_to_bf16(x)) };
        pairs.copy_from_slice(&all[..pairs.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit patterns around every case of the rounding: ties to even and odd, carries into the
    /// exponent and to infinity, subnormals, infinities, quiet and signalling NaNs, both signs.
    fn awkward_floats() -> Vec<f32> {
        let mut bits: Vec<u32> = vec![
            0x0000_0000,
            0x0000_0001,
            0x0000_8000,
            0x0001_8000,
            0x007f_ffff,
            0x0080_0000,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_8001,
            0x3f80_7fff,
            0x3fff_ffff,
            0x7f7f_7fff,
            0x7f7f_8000,
            0x7f7f_ffff,
            0x7f80_0000,
            0x7f80_0001,
            0x7fc0_0000,
            0x7fbf_ffff,
            0x7fff_ffff,
        ];
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        bits.extend((0..4096).map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u32
        }));
        let negated: Vec<u32> = bits.iter().map(|b| b | 0x8000_0000).collect();
        bits.extend(negated);
        bits.into_iter().map(f32::from_bits).collect()
    }

    #[test]
    fn rounding_without_branches_matches_half_on_every_case() {
        let values = awkward_floats();
        let mut rounded = vec![0.0; values.len()];
        round_to_bf16_values(&values, &mut rounded);
        for (&value, &rounded) in values.iter().zip(&rounded) {
            let expected = half::bf16::from_f32(value).to_f32();
            assert_eq!(
                rounded.to_bits(),
                expected.to_bits(),
                "{:#010x}",
                value.to_bits()
            );
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn bf16_pairs_hold_each_rounded_input_pair() {
        use std::arch::is_x86_feature_detected as has;
        if !(has!("avx512f") && has!("avx512bf16")) {
            return;
        }
        let is_subnormal = |v: f32| v != 0.0 && v.abs() < f32::MIN_POSITIVE;
        let values: Vec<f32> = awkward_floats()
            .into_iter()
            .filter(|v| !is_subnormal(*v))
            .collect();
        for len in [0, 1, 2, 31, 32, 33, 63, 64, 65, values.len()] {
            let row = &values[..len];
            let mut pairs = vec![u32::MAX; len.div_ceil(2)];
            // SAFETY: the CPU has AVX-512 BF16 (checked above).
            unsafe { round_to_bf16_pairs(row, &mut pairs) };
            for (i, &pair) in pairs.iter().enumerate() {
                // The hardware may give a NaN another payload: any NaN stands for a NaN.
                let same = |got: u16, k: usize| {
                    let want = row
                        .get(k)
                        .map_or(half::bf16::ZERO, |&v| half::bf16::from_f32(v));
                    let got = half::bf16::from_bits(got);
                    got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan()
                };
                assert!(
                    same(pair as u16, 2 * i) && same((pair >> 16) as u16, 2 * i + 1),
                    "pair {i} of a {len}-input row: {pair:#010x}"
                );
            }
        }
    }
}
