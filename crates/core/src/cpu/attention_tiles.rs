//! The register tiles of the CPU attention kernels, one set per vector level, and the steps
//! of a head that use them.
//!
//! A head is computed in blocks of [`ROWS`] query rows. Its keys are laid out once in blocks of
//! `KEYS` positions, `[D, KEYS]` each (32 with AVX-512, 16 otherwise), so that a block's scores
//! against a row block are `ROWS x KEYS` sums in eight vector registers, one fused multiply-add
//! per query row and vector per head dimension, no horizontal sums. Its values are copied once
//! with rows padded to whole vectors, and a row block's weighted values are `ROWS x COLUMNS`
//! sums in registers (64 columns with AVX-512, 16 otherwise) while the value rows stream past.
//! AVX-512 and AVX2 tiles are written in intrinsics, a portable set is left to the compiler;
//! [`for_each_head`] runs a per-head job with the tiles of the level it is given.

use super::decode_attention::Strided;
use super::host::parallel_output;
use super::isa::VectorLevel;

/// Query rows computed together: each key and value row loaded serves all of them.
pub(super) const ROWS: usize = 4;
/// Value columns per vector-sized step of the weighted values; head dims are padded to it.
pub(super) const LANES: usize = 16;
/// The widest value tile any level uses.
pub(super) const MAX_COLUMNS: usize = 64;

/// Work on one query head (task `b * NH + h`) that uses the tiles of a vector level.
pub(super) trait HeadJob: Sync {
    /// Writes task `task`'s output into `out`.
    ///
    /// # Safety
    /// The CPU must have `T`'s instructions.
    unsafe fn run<T: Tiles>(&self, task: usize, out: &mut [f32]);
}

/// Runs `job` for every head on rayon's threads, with the tiles of `level` (which this CPU
/// must have): `len` values, each task's `per_task` of them zero until it writes them.
pub(super) fn for_each_head<J: HeadJob>(
    level: VectorLevel,
    job: &J,
    len: usize,
    per_task: usize,
) -> Vec<f32> {
    parallel_output(len, per_task, |task, out| match level {
        // SAFETY: `level` is `vector_level()` or below it, which found AVX-512F,
        // AVX-512VL and FMA on this CPU.
        #[cfg(target_arch = "x86_64")]
        VectorLevel::Avx512 => unsafe { run_avx512(job, task, out) },
        // SAFETY: as above, AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        VectorLevel::Avx2 => unsafe { run_avx2(job, task, out) },
        // SAFETY: the portable tiles need no instruction beyond the target's baseline.
        VectorLevel::Baseline => unsafe { job.run::<PortableTiles>(task, out) },
    })
}

/// `job` compiled for AVX-512.
///
/// # Safety
/// The CPU must have AVX-512F, AVX-512VL and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn run_avx512<J: HeadJob>(job: &J, task: usize, out: &mut [f32]) {
    // SAFETY: this function's features are the tiles'.
    unsafe { job.run::<x86::Avx512Tiles>(task, out) }
}

/// `job` compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2<J: HeadJob>(job: &J, task: usize, out: &mut [f32]) {
    // SAFETY: this function's features are the tiles'.
    unsafe { job.run::<x86::Avx2Tiles>(task, out) }
}

/// A key/value head's keys in blocks of `KEYS` positions, each `[D, KEYS]` (block `i` at
/// `[i * D * KEYS..]`), zero past the last position.
#[inline(always)]
pub(super) fn key_blocks<T: Tiles>(
    keys: &Strided<'_>,
    head: [usize; 2],
    positions: usize,
    dim: usize,
) -> Vec<f32> {
    let width = T::KEYS;
    let mut blocks = vec![0.0f32; positions.div_ceil(width) * width * dim];
    for position in 0..positions {
        let key = keys.row(head[0], head[1], position, dim);
        let block = &mut blocks[(position / width) * width * dim..][..width * dim];
        for (d, &value) in key.iter().enumerate() {
            block[d * width + position % width] = value;
        }
    }
    blocks
}

/// A key/value head's values `[S, width]`, each row of `dim` padded with zeros to `width` (the
/// head dim rounded up to whole [`LANES`]).
pub(super) struct ValueRows {
    data: Vec<f32>,
    width: usize,
    dim: usize,
}

impl ValueRows {
    /// The values of head `[b, kv_head]`.
    #[inline(always)]
    pub(super) fn of(values: &Strided<'_>, head: [usize; 2], positions: usize, dim: usize) -> Self {
        let width = dim.div_ceil(LANES) * LANES;
        let mut data = vec![0.0f32; positions * width];
        for (position, row) in data.chunks_exact_mut(width.max(1)).enumerate() {
            row[..dim].copy_from_slice(values.row(head[0], head[1], position, dim));
        }
        ValueRows { data, width, dim }
    }
}

impl ValueRows {
    /// `count` rows of `dim` values from `values` (row-major), padded like [`ValueRows::of`].
    #[inline(always)]
    pub(super) fn from_rows(values: &[f32], count: usize, dim: usize) -> Self {
        let width = dim.div_ceil(LANES) * LANES;
        let mut data = vec![0.0f32; count * width];
        for (row, source) in data
            .chunks_exact_mut(width.max(1))
            .zip(values.chunks_exact(dim.max(1)))
        {
            row[..dim].copy_from_slice(source);
        }
        ValueRows { data, width, dim }
    }
}

/// How [`multiply_rows`] lands its sums `p` in a destination entry `d`.
#[derive(Debug, Clone, Copy)]
pub(super) enum Landing {
    /// `d = p`.
    Replace,
    /// `d = keep · d + sign · p`.
    Accumulate { keep: f32, sign: f32 },
}

/// `dst [m, D] ← a [m, S] · values [S, D]` (`a` row-major, its rows `S = a.len() / m` long;
/// `dst` rows of `D = values.dim`), landed as `landing` says, [`ROWS`] rows at a time.
///
/// # Safety
/// The CPU must have `T`'s instructions; `values` holds at least `S` rows, `dst` `m x D`
/// values and `m >= 1`.
#[inline(always)]
pub(super) unsafe fn multiply_rows<T: Tiles>(
    a: &[f32],
    m: usize,
    values: &ValueRows,
    dst: &mut [f32],
    landing: Landing,
) {
    let (depth, dim) = (a.len() / m, values.dim);
    let mut sums = [[0.0f32; MAX_COLUMNS]; ROWS];
    for first in (0..m).step_by(ROWS) {
        let rows = ROWS.min(m - first);
        // Rows past `m` repeat the last one: computed alongside in whole vectors, never stored.
        let weights: [&[f32]; ROWS] =
            std::array::from_fn(|r| &a[(first + r.min(rows - 1)) * depth..][..depth]);
        let mut column = 0;
        while column < dim {
            let columns = match column + T::COLUMNS <= values.width {
                true => T::COLUMNS,
                false => LANES,
            };
            // SAFETY: the caller's contract; every weight row is `depth` long and
            // `column + columns <= width` (both multiples of `LANES`).
            unsafe { T::value_tile(&weights, values, column, columns, &mut sums) };
            let stored = columns.min(dim - column);
            for (r, sums) in sums.iter().enumerate().take(rows) {
                let out = &mut dst[(first + r) * dim + column..][..stored];
                match landing {
                    Landing::Replace => out.copy_from_slice(&sums[..stored]),
                    Landing::Accumulate { keep, sign } => {
                        for (o, &p) in out.iter_mut().zip(sums) {
                            *o = keep * *o + sign * p;
                        }
                    }
                }
            }
            column += columns;
        }
    }
}

/// A row block's queries from `queries` `[T, D]`, rows `first..first + rows`, into `lanes`
/// (`[D]` of `ROWS` lanes; lanes past `rows` zero, so their sums are computed alongside in whole
/// vectors and never stored).
#[inline(always)]
pub(super) fn load_queries(queries: &[f32], first: usize, rows: usize, lanes: &mut [[f32; ROWS]]) {
    let dim = lanes.len();
    for (d, lanes) in lanes.iter_mut().enumerate() {
        for (r, lane) in lanes.iter_mut().enumerate() {
            *lane = match r < rows {
                true => queries[(first + r) * dim + d],
                false => 0.0,
            };
        }
    }
}

/// The scaled scores of a row block (`query`, `[D]` of `ROWS` lanes) against every key block
/// (from [`key_blocks`]) that starts before `end`, into `scores` `[ROWS, stride]`.
///
/// # Safety
/// The CPU must have `T`'s instructions; `stride` is at least the key blocks' positions.
#[inline(always)]
pub(super) unsafe fn score_blocks<T: Tiles>(
    query: &[[f32; ROWS]],
    keys: &[f32],
    end: usize,
    scale: f32,
    (scores, stride): (&mut [f32], usize),
) {
    let block_len = (query.len() * T::KEYS).max(1);
    for (block, block_keys) in keys.chunks_exact(block_len).enumerate() {
        if block * T::KEYS >= end {
            break;
        }
        // SAFETY: the block holds `D x KEYS` keys; row `ROWS - 1` of the scores ends at
        // `(ROWS - 1) * stride + stride`, past this block's last key.
        unsafe {
            T::score_tile(
                query,
                block_keys,
                scale,
                &mut scores[block * T::KEYS..],
                stride,
            )
        };
    }
}

/// `out[r][c] = factors[r] · Σ_s weights[r][s] · values[s][c]` for the block's first `rows`
/// rows of `out` (`[rows, D]`), `s` over the weights' positions.
///
/// # Safety
/// The CPU must have `T`'s instructions; every weight slice is as long as the first, and
/// `values` holds at least that many rows.
#[inline(always)]
pub(super) unsafe fn weigh_values<T: Tiles>(
    weights: &[&[f32]; ROWS],
    values: &ValueRows,
    factors: &[f32; ROWS],
    rows: usize,
    out: &mut [f32],
) {
    let dim = values.dim;
    let mut sums = [[0.0f32; MAX_COLUMNS]; ROWS];
    let mut column = 0;
    while column < dim {
        let columns = match column + T::COLUMNS <= values.width {
            true => T::COLUMNS,
            false => LANES,
        };
        // SAFETY: the caller's contract, and `column + columns <= width` (both multiples of
        // `LANES`).
        unsafe { T::value_tile(weights, values, column, columns, &mut sums) };
        let stored = columns.min(dim - column);
        for (r, sums) in sums.iter().enumerate().take(rows) {
            let out = &mut out[r * dim + column..][..stored];
            for (o, &s) in out.iter_mut().zip(sums) {
                *o = s * factors[r];
            }
        }
        column += columns;
    }
}

/// The register tiles of one vector level: a block of scores and a block of weighted values
/// for [`ROWS`] query rows at a time.
pub(super) trait Tiles {
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

/// Tiles left to the compiler, for CPUs without the vector levels above (aarch64's NEON fuses
/// multiply-adds; x86-64's baseline does not, so the sums take a product and an addition there
/// rather than a call to libm's `fmaf`).
pub(super) struct PortableTiles;

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
