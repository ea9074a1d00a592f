//! Attention of a prompt call's queries over their keys on the CPU (`flex`) backend.
//!
//! burn-flex's attention multiplies `Q Kᵀ` and `P V` with `gemm` but scales, masks and
//! exponentiates the scores element by element through libm, which took a third of a 512-token
//! GPT-2 call. Here each query head is computed in blocks of [`ROWS`] query rows, by register
//! tiles written for each vector level (`Tiles`: AVX-512 and AVX2 in intrinsics, a portable
//! one left to the compiler), picked by [`isa::vector_level`](super::isa::vector_level) and
//! capped like the products by `HOOKSCOPE_CPU_KERNELS`:
//! - scores: the head's keys are laid out once per head in blocks of `KEYS` positions, `[D,
//!   KEYS]` each (32 with AVX-512, 16 otherwise), so that a block's scores against the row
//!   block are `ROWS x KEYS` sums in eight vector registers, one fused multiply-add per query row
//!   and vector per head dimension, no horizontal sums; only keys up to the block's last
//!   visible one are visited (half the work under a causal mask);
//! - softmax: in place over each row's scores, with `elementwise`'s vectorised exponential;
//! - weighted values: the values copied once per head with rows padded to whole vectors, then
//!   `ROWS x COLUMNS` output sums in registers (64 columns with AVX-512, 16 otherwise) while
//!   the value rows stream past.
//!
//! Grouped key/value heads are read where they lie, once per query head of their group. Other
//! backends, dtypes and layouts go to burn.

use burn::tensor::{Bool, Tensor};
use rayon::prelude::*;

use super::decode_attention::{Sizes, Strided, on_host};
use super::elementwise::exp_f32;
use super::isa::{VectorLevel, vector_level};

/// Query rows computed together: each key and value row loaded serves all of them.
const ROWS: usize = 4;
/// Value columns per vector-sized step of the weighted values; head dims are padded to it.
const LANES: usize = 16;

/// `softmax(scale · Q Kᵀ, masked) V` for `queries` `[B, NH, T, D]` over `keys` and `values`
/// `[B, NKV, S, D]` (each key/value head shared by `NH / NKV` query heads), `mask` `[B, 1, T, S]`
/// true where a query must not see a key; `[B, NH, T, D]`, rows that see no key all zero (as
/// burn computes them). `None` where this path does not apply (another backend or dtype, a
/// non-contiguous head dim).
pub(crate) fn attend(
    queries: &Tensor<4>,
    keys: &Tensor<4>,
    values: &Tensor<4>,
    mask: &Tensor<4, Bool>,
    scale: f32,
) -> Option<Tensor<4>> {
    attend_at(vector_level(), [queries, keys, values], mask, scale)
}

/// [`attend`] of `[queries, keys, values]` with the kernels of `level` (which this CPU must
/// have).
pub(super) fn attend_at(
    level: VectorLevel,
    [queries, keys, values]: [&Tensor<4>; 3],
    mask: &Tensor<4, Bool>,
    scale: f32,
) -> Option<Tensor<4>> {
    on_host(queries, keys, values, mask, |host| {
        let sizes = host.sizes;
        let (heads, tokens, positions) = (sizes.heads, sizes.tokens, sizes.positions);
        // Past the last visible key of each query row nothing is computed: its end, per batch
        // row and query row (the mask is shared by every head).
        let ends: Vec<usize> = host
            .hidden
            .chunks_exact(positions.max(1))
            .map(|row| {
                row.iter()
                    .rposition(|&hidden| !hidden)
                    .map_or(0, |last| last + 1)
            })
            .collect();
        let per_head = tokens * sizes.dim;
        let mut output = vec![0.0f32; sizes.batch * heads * per_head];
        output
            .par_chunks_mut(per_head.max(1))
            .enumerate()
            .for_each(|(task, out)| {
                let (b, h) = (task / heads, task % heads);
                let operands = HeadOperands {
                    queries: &host.queries[task * per_head..][..per_head],
                    keys: &host.keys,
                    values: &host.values,
                    b,
                    kv_head: h / (heads / sizes.kv_heads),
                    hidden: &host.hidden[b * tokens * positions..][..tokens * positions],
                    ends: &ends[b * tokens..][..tokens],
                };
                attend_head(level, &sizes, scale, &operands, out);
            });
        output
    })
}

/// One query head's operands: its queries `[T, D]`, its key/value head, and its batch row's
/// mask `[T, S]` with each query row's end (one past its last visible key).
struct HeadOperands<'a> {
    queries: &'a [f32],
    keys: &'a Strided<'a>,
    values: &'a Strided<'a>,
    b: usize,
    kv_head: usize,
    hidden: &'a [bool],
    ends: &'a [usize],
}

/// One query head into `out` `[T, D]`, with the kernels of `level`.
fn attend_head(
    level: VectorLevel,
    sizes: &Sizes,
    scale: f32,
    operands: &HeadOperands<'_>,
    out: &mut [f32],
) {
    match level {
        // SAFETY: `level` is `vector_level()` or below it, which found AVX-512F, AVX-512VL and
        // FMA on this CPU.
        #[cfg(target_arch = "x86_64")]
        VectorLevel::Avx512 => unsafe { attend_head_avx512(sizes, scale, operands, out) },
        // SAFETY: as above, AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        VectorLevel::Avx2 => unsafe { attend_head_avx2(sizes, scale, operands, out) },
        // SAFETY: the portable tiles need no instruction beyond the target's baseline.
        VectorLevel::Baseline => unsafe {
            attend_head_tiled::<PortableTiles>(sizes, scale, operands, out)
        },
    }
}

/// [`attend_head_tiled`] compiled for AVX-512.
///
/// # Safety
/// The CPU must have AVX-512F, AVX-512VL and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn attend_head_avx512(
    sizes: &Sizes,
    scale: f32,
    operands: &HeadOperands<'_>,
    out: &mut [f32],
) {
    // SAFETY: this function's features are the tiles'.
    unsafe { attend_head_tiled::<x86::Avx512Tiles>(sizes, scale, operands, out) }
}

/// [`attend_head_tiled`] compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_head_avx2(
    sizes: &Sizes,
    scale: f32,
    operands: &HeadOperands<'_>,
    out: &mut [f32],
) {
    // SAFETY: this function's features are the tiles'.
    unsafe { attend_head_tiled::<x86::Avx2Tiles>(sizes, scale, operands, out) }
}

/// The register tiles of one vector level: a block of scores and a block of weighted values
/// for [`ROWS`] query rows at a time.
trait Tiles {
    /// Keys per score tile (a block of the transposed keys).
    const KEYS: usize;
    /// Value columns per full value tile, a multiple of [`LANES`] and at most [`MAX_COLUMNS`].
    const COLUMNS: usize;

    /// `scores[r * stride + k] = scale * Σ_d query[d][r] · keys[d * KEYS + k]` for `k` in
    /// `0..KEYS`, with `keys` one block `[D, KEYS]`.
    ///
    /// # Safety
    /// The CPU must have the level's instructions; `keys` holds `query.len() * KEYS` values and
    /// `scores` at least `(ROWS - 1) * stride + KEYS`.
    unsafe fn score_tile(
        query: &[[f32; ROWS]],
        keys: &[f32],
        scale: f32,
        scores: &mut [f32],
        stride: usize,
    );

    /// `sums[r][c] = Σ_s weights[r][s] · values[s][column + c]` for `c` in `0..columns`
    /// (`COLUMNS` or `LANES`), `s` over the weights' positions.
    ///
    /// # Safety
    /// The CPU must have the level's instructions; every weight slice is as long as the first,
    /// `values` holds that many rows, and `column + columns <= values.width`.
    unsafe fn value_tile(
        weights: &[&[f32]; ROWS],
        values: &ValueRows,
        column: usize,
        columns: usize,
        sums: &mut [[f32; MAX_COLUMNS]; ROWS],
    );
}

/// The widest value tile any level uses.
const MAX_COLUMNS: usize = 64;

/// One key/value head's values `[S, width]`, each row padded with zeros to `width` (the head
/// dim rounded up to whole [`LANES`]).
struct ValueRows {
    data: Vec<f32>,
    width: usize,
}

impl ValueRows {
    #[inline(always)]
    fn of(operands: &HeadOperands<'_>, positions: usize, dim: usize) -> Self {
        let width = dim.div_ceil(LANES) * LANES;
        let mut data = vec![0.0f32; positions * width];
        for (position, row) in data.chunks_exact_mut(width.max(1)).enumerate() {
            let value = operands
                .values
                .row(operands.b, operands.kv_head, position, dim);
            row[..dim].copy_from_slice(value);
        }
        ValueRows { data, width }
    }
}

/// One query head with the tiles `T`.
///
/// # Safety
/// The CPU must have `T`'s instructions.
#[inline(always)]
unsafe fn attend_head_tiled<T: Tiles>(
    sizes: &Sizes,
    scale: f32,
    operands: &HeadOperands<'_>,
    out: &mut [f32],
) {
    let (tokens, positions, dim) = (sizes.tokens, sizes.positions, sizes.dim);
    let keys = transposed_keys(operands, positions, dim, T::KEYS);
    let values = ValueRows::of(operands, positions, dim);
    // The row block's scaled scores, `[ROWS, padded]`, then its weights in place.
    let padded = positions.div_ceil(T::KEYS) * T::KEYS;
    let mut scores = vec![0.0f32; ROWS * padded];
    // The row block's queries, `[D]` of `ROWS` lanes.
    let mut query = vec![[0.0f32; ROWS]; dim];
    let mut sums = [[0.0f32; MAX_COLUMNS]; ROWS];
    for first in (0..tokens).step_by(ROWS) {
        let rows = ROWS.min(tokens - first);
        let end = operands.ends[first..first + rows]
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        // Lanes past the block's last row are zero: their scores and weighted values are
        // computed alongside (whole vectors) and never stored.
        for (d, lanes) in query.iter_mut().enumerate() {
            for (r, lane) in lanes.iter_mut().enumerate() {
                *lane = match r < rows {
                    true => operands.queries[(first + r) * dim + d],
                    false => 0.0,
                };
            }
        }
        let block_len = (dim * T::KEYS).max(1);
        for (block, block_keys) in keys.chunks_exact(block_len).enumerate() {
            if block * T::KEYS >= end {
                break;
            }
            // SAFETY: the block holds `D x KEYS` keys; row `ROWS - 1` of the scores ends at
            // `(ROWS - 1) * padded + padded`, past this block's last key.
            unsafe {
                T::score_tile(
                    &query,
                    block_keys,
                    scale,
                    &mut scores[block * T::KEYS..],
                    padded,
                )
            };
        }
        // Each row's weights in place of its scores (all zero for a row that sees no key),
        // and the factor that normalises them.
        let mut inverse = [0.0f32; ROWS];
        for (r, inverse) in inverse.iter_mut().enumerate().take(rows) {
            let hidden = &operands.hidden[(first + r) * positions..][..end];
            *inverse = softmax_in_place(&mut scores[r * padded..][..end], hidden);
        }
        let weights: [&[f32]; ROWS] = std::array::from_fn(|r| &scores[r * padded..][..end]);
        let mut column = 0;
        while column < dim {
            let columns = match column + T::COLUMNS <= values.width {
                true => T::COLUMNS,
                false => LANES,
            };
            // SAFETY: every weight slice has `end` positions, `values` `positions >= end` rows
            // of `width`, and `column + columns <= width` (both multiples of `LANES`).
            unsafe { T::value_tile(&weights, &values, column, columns, &mut sums) };
            let stored = columns.min(dim - column);
            for (r, sums) in sums.iter().enumerate().take(rows) {
                let out = &mut out[(first + r) * dim + column..][..stored];
                for (o, &s) in out.iter_mut().zip(sums) {
                    *o = s * inverse[r];
                }
            }
            column += columns;
        }
    }
}

/// One key/value head's keys in blocks of `keys` positions, each `[D, keys]` (block `i` at
/// `[i * D * keys..]`), zero past the last position.
#[inline(always)]
fn transposed_keys(
    operands: &HeadOperands<'_>,
    positions: usize,
    dim: usize,
    keys: usize,
) -> Vec<f32> {
    let mut blocks = vec![0.0f32; positions.div_ceil(keys) * keys * dim];
    for position in 0..positions {
        let key = operands
            .keys
            .row(operands.b, operands.kv_head, position, dim);
        let block = &mut blocks[(position / keys) * keys * dim..][..keys * dim];
        for (d, &value) in key.iter().enumerate() {
            block[d * keys + position % keys] = value;
        }
    }
    blocks
}

/// Tiles left to the compiler, for CPUs without the vector levels above (aarch64's NEON fuses
/// multiply-adds; x86-64's baseline does not, so the sums take a product and an addition there
/// rather than a call to libm's `fmaf`).
struct PortableTiles;

impl PortableTiles {
    const FUSED: bool = cfg!(target_arch = "aarch64");

    #[inline(always)]
    fn multiply_add(a: f32, b: f32, c: f32) -> f32 {
        match Self::FUSED {
            true => a.mul_add(b, c),
            false => a * b + c,
        }
    }
}

impl Tiles for PortableTiles {
    const KEYS: usize = 16;
    const COLUMNS: usize = LANES;

    unsafe fn score_tile(
        query: &[[f32; ROWS]],
        keys: &[f32],
        scale: f32,
        scores: &mut [f32],
        stride: usize,
    ) {
        let mut sums = [[0.0f32; Self::KEYS]; ROWS];
        for (q, k) in query.iter().zip(keys.chunks_exact(Self::KEYS)) {
            for (sum, &q) in sums.iter_mut().zip(q) {
                for (s, &k) in sum.iter_mut().zip(k) {
                    *s = Self::multiply_add(q, k, *s);
                }
            }
        }
        for (r, sums) in sums.iter().enumerate() {
            for (score, &sum) in scores[r * stride..][..Self::KEYS].iter_mut().zip(sums) {
                *score = sum * scale;
            }
        }
    }

    unsafe fn value_tile(
        weights: &[&[f32]; ROWS],
        values: &ValueRows,
        column: usize,
        columns: usize,
        sums: &mut [[f32; MAX_COLUMNS]; ROWS],
    ) {
        let mut tile = [[0.0f32; LANES]; ROWS];
        debug_assert_eq!(columns, LANES);
        for (position, row) in values
            .data
            .chunks_exact(values.width)
            .take(weights[0].len())
            .enumerate()
        {
            let value = &row[column..column + LANES];
            for (sum, weights) in tile.iter_mut().zip(weights) {
                let weight = weights[position];
                for (s, &v) in sum.iter_mut().zip(value) {
                    *s = Self::multiply_add(weight, v, *s);
                }
            }
        }
        for (sums, tile) in sums.iter_mut().zip(&tile) {
            sums[..LANES].copy_from_slice(tile);
        }
    }
}

/// The AVX-512 and AVX2 tiles, in intrinsics: each keeps its `ROWS x` tile sums in vector
/// registers (eight for the scores, up to sixteen for the weighted values).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{LANES, MAX_COLUMNS, ROWS, Tiles, ValueRows};

    /// 32-key score tiles (two vectors a row), 64-column value tiles (four vectors a row).
    pub(super) struct Avx512Tiles;

    impl Tiles for Avx512Tiles {
        const KEYS: usize = 32;
        const COLUMNS: usize = 64;

        #[target_feature(enable = "avx512f,fma")]
        #[inline]
        unsafe fn score_tile(
            query: &[[f32; ROWS]],
            keys: &[f32],
            scale: f32,
            scores: &mut [f32],
            stride: usize,
        ) {
            assert!(keys.len() >= query.len() * 32 && scores.len() >= (ROWS - 1) * stride + 32);
            let mut sums = [[_mm512_setzero_ps(); 2]; ROWS];
            let keys = keys.as_ptr();
            for (d, q) in query.iter().enumerate() {
                // SAFETY: `d * 32 + 32 <= keys.len()` (asserted above).
                let (k0, k1) = unsafe {
                    (
                        _mm512_loadu_ps(keys.add(d * 32)),
                        _mm512_loadu_ps(keys.add(d * 32 + 16)),
                    )
                };
                for (sum, &q) in sums.iter_mut().zip(q) {
                    let q = _mm512_set1_ps(q);
                    sum[0] = _mm512_fmadd_ps(q, k0, sum[0]);
                    sum[1] = _mm512_fmadd_ps(q, k1, sum[1]);
                }
            }
            let scale = _mm512_set1_ps(scale);
            for (r, sum) in sums.iter().enumerate() {
                // SAFETY: row `r` of the scores has 32 places (asserted above).
                unsafe {
                    let row = scores.as_mut_ptr().add(r * stride);
                    _mm512_storeu_ps(row, _mm512_mul_ps(sum[0], scale));
                    _mm512_storeu_ps(row.add(16), _mm512_mul_ps(sum[1], scale));
                }
            }
        }

        #[target_feature(enable = "avx512f,fma")]
        #[inline]
        unsafe fn value_tile(
            weights: &[&[f32]; ROWS],
            values: &ValueRows,
            column: usize,
            columns: usize,
            sums: &mut [[f32; MAX_COLUMNS]; ROWS],
        ) {
            // SAFETY: the caller's contract, with `columns` 64 or 16.
            unsafe {
                match columns {
                    64 => value_tile_avx512::<4>(weights, values, column, sums),
                    _ => value_tile_avx512::<1>(weights, values, column, sums),
                }
            }
        }
    }

    /// [`Tiles::value_tile`] over `V` AVX-512 vectors of columns.
    ///
    /// # Safety
    /// As [`Tiles::value_tile`], with `columns = 16 V`; the CPU must have AVX-512F.
    #[target_feature(enable = "avx512f,fma")]
    #[inline]
    unsafe fn value_tile_avx512<const V: usize>(
        weights: &[&[f32]; ROWS],
        values: &ValueRows,
        column: usize,
        sums: &mut [[f32; MAX_COLUMNS]; ROWS],
    ) {
        let (width, values) = (values.width, &values.data);
        let positions = weights[0].len();
        assert!(weights.iter().all(|w| w.len() == positions));
        assert!(column + 16 * V <= width && values.len() >= positions * width);
        let mut tile = [[_mm512_setzero_ps(); V]; ROWS];
        for position in 0..positions {
            // SAFETY: row `position` is within `values`, columns within the row (asserted).
            let row = unsafe { values.as_ptr().add(position * width + column) };
            let mut value = [_mm512_setzero_ps(); V];
            for (v, value) in value.iter_mut().enumerate() {
                // SAFETY: as above.
                *value = unsafe { _mm512_loadu_ps(row.add(16 * v)) };
            }
            for (sum, weights) in tile.iter_mut().zip(weights) {
                // SAFETY: `position < positions`, every weight slice's length.
                let weight = _mm512_set1_ps(unsafe { *weights.get_unchecked(position) });
                for (s, &v) in sum.iter_mut().zip(&value) {
                    *s = _mm512_fmadd_ps(weight, v, *s);
                }
            }
        }
        for (sums, tile) in sums.iter_mut().zip(&tile) {
            for (v, &vector) in tile.iter().enumerate() {
                // SAFETY: `16 V <= MAX_COLUMNS`.
                unsafe { _mm512_storeu_ps(sums.as_mut_ptr().add(16 * v), vector) };
            }
        }
    }

    /// 16-key score tiles and 16-column value tiles, two vectors a row each.
    pub(super) struct Avx2Tiles;

    impl Tiles for Avx2Tiles {
        const KEYS: usize = 16;
        const COLUMNS: usize = LANES;

        #[target_feature(enable = "avx2,fma")]
        #[inline]
        unsafe fn score_tile(
            query: &[[f32; ROWS]],
            keys: &[f32],
            scale: f32,
            scores: &mut [f32],
            stride: usize,
        ) {
            assert!(keys.len() >= query.len() * 16 && scores.len() >= (ROWS - 1) * stride + 16);
            let mut sums = [[_mm256_setzero_ps(); 2]; ROWS];
            let keys = keys.as_ptr();
            for (d, q) in query.iter().enumerate() {
                // SAFETY: `d * 16 + 16 <= keys.len()` (asserted above).
                let (k0, k1) = unsafe {
                    (
                        _mm256_loadu_ps(keys.add(d * 16)),
                        _mm256_loadu_ps(keys.add(d * 16 + 8)),
                    )
                };
                for (sum, &q) in sums.iter_mut().zip(q) {
                    let q = _mm256_set1_ps(q);
                    sum[0] = _mm256_fmadd_ps(q, k0, sum[0]);
                    sum[1] = _mm256_fmadd_ps(q, k1, sum[1]);
                }
            }
            let scale = _mm256_set1_ps(scale);
            for (r, sum) in sums.iter().enumerate() {
                // SAFETY: row `r` of the scores has 16 places (asserted above).
                unsafe {
                    let row = scores.as_mut_ptr().add(r * stride);
                    _mm256_storeu_ps(row, _mm256_mul_ps(sum[0], scale));
                    _mm256_storeu_ps(row.add(8), _mm256_mul_ps(sum[1], scale));
                }
            }
        }

        #[target_feature(enable = "avx2,fma")]
        #[inline]
        unsafe fn value_tile(
            weights: &[&[f32]; ROWS],
            values: &ValueRows,
            column: usize,
            _columns: usize,
            sums: &mut [[f32; MAX_COLUMNS]; ROWS],
        ) {
            let (width, values) = (values.width, &values.data);
            let positions = weights[0].len();
            assert!(weights.iter().all(|w| w.len() == positions));
            assert!(column + 16 <= width && values.len() >= positions * width);
            let mut tile = [[_mm256_setzero_ps(); 2]; ROWS];
            for position in 0..positions {
                // SAFETY: row `position` is within `values`, columns within the row (asserted).
                let (v0, v1) = unsafe {
                    let row = values.as_ptr().add(position * width + column);
                    (_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8)))
                };
                for (sum, weights) in tile.iter_mut().zip(weights) {
                    // SAFETY: `position < positions`, every weight slice's length.
                    let weight = _mm256_set1_ps(unsafe { *weights.get_unchecked(position) });
                    sum[0] = _mm256_fmadd_ps(weight, v0, sum[0]);
                    sum[1] = _mm256_fmadd_ps(weight, v1, sum[1]);
                }
            }
            for (sums, tile) in sums.iter_mut().zip(&tile) {
                // SAFETY: 16 <= MAX_COLUMNS.
                unsafe {
                    _mm256_storeu_ps(sums.as_mut_ptr(), tile[0]);
                    _mm256_storeu_ps(sums.as_mut_ptr().add(8), tile[1]);
                }
            }
        }
    }
}

/// A row's scores (`hidden` true where a key is masked) replaced by their unnormalised weights
/// `e^(score - max)`, zero where hidden; returns the factor that normalises them (zero for a
/// row that sees no key).
#[inline(always)]
fn softmax_in_place(weights: &mut [f32], hidden: &[bool]) -> f32 {
    for (weight, &hidden) in weights.iter_mut().zip(hidden) {
        *weight = if hidden { f32::NEG_INFINITY } else { *weight };
    }
    // Branch-free forms, so that both loops vectorise (no score is NaN).
    let max = weights
        .iter()
        .fold(f32::NEG_INFINITY, |m, &w| if w > m { w } else { m });
    for weight in weights.iter_mut() {
        let shifted = *weight - max;
        *weight = if shifted == f32::NEG_INFINITY || max == f32::NEG_INFINITY {
            0.0
        } else {
            exp_f32(shifted)
        };
    }
    let total = sum_lanes(weights);
    if total > 0.0 { 1.0 / total } else { 0.0 }
}

/// `Σ values` in [`LANES`] independent lanes (so that it vectorises), then summed.
#[inline(always)]
fn sum_lanes(values: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (body, tail) = values.as_chunks::<LANES>();
    for chunk in body {
        for (lane, &value) in lanes.iter_mut().zip(chunk) {
            *lane += value;
        }
    }
    lanes.iter().sum::<f32>() + tail.iter().sum::<f32>()
}
