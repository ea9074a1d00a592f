//! The register tiles of the CPU attention kernels, one set per vector level, and the steps
//! of a head that use them.
//!
//! A head is computed in blocks of [`ROWS`] query rows. Its keys are laid out once in blocks of
//! `KEYS` positions, `[D, KEYS]` each (32 with AVX-512, 16 with AVX2 and NEON), so that a
//! block's scores against a row block are `ROWS x KEYS` sums in vector registers, one fused
//! multiply-add per query row and vector per head dimension, no horizontal sums. Its values are
//! copied once with rows padded to whole vectors, and a row block's weighted values are
//! `ROWS x COLUMNS` sums in registers (64 columns with AVX-512, 16 otherwise) while the value
//! rows stream past. The tiles are written once over a [`Vector`] register ([`VectorTiles`])
//! and sized for each level's registers; [`for_each_head`] runs a per-head job with the tiles
//! of the level it is given.

use super::decode_attention::Strided;
use super::host::parallel_output;
use super::isa::VectorLevel;
#[cfg(not(target_arch = "aarch64"))]
use super::vector::PlainLanes;
use super::vector::Vector;

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
    /// Implementations are `#[inline(always)]`, as is all they call with `T`: [`for_each_head`]
    /// compiles them into a function with the level's target features, which out-of-line code
    /// would not have (its tiles' vector methods would then be calls, each of them).
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
        // SAFETY: the baseline tiles need no instruction beyond the target's baseline (NEON
        // on aarch64, SSE2 on x86-64).
        VectorLevel::Baseline => unsafe { job.run::<BaselineTiles>(task, out) },
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
    unsafe { job.run::<Avx512Tiles>(task, out) }
}

/// `job` compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2<J: HeadJob>(job: &J, task: usize, out: &mut [f32]) {
    // SAFETY: this function's features are the tiles'.
    unsafe { job.run::<Avx2Tiles>(task, out) }
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

/// The tiles of one [`Vector`] type: score tiles of `KEY_VECTORS` vectors a row, value tiles of
/// `COLUMN_VECTORS` vectors a row, and of `STEP_VECTORS` (one [`LANES`]-wide step) for a head's
/// columns past the last whole tile. A tile's `ROWS x` vectors of sums stay in registers while
/// the keys or value rows stream past: one fused multiply-add per row and vector per input.
/// `STEP_VECTORS` is `LANES / V::LANES`, checked against it: a parameter because stable Rust
/// cannot size the tile's array by an expression of `V`.
pub(super) struct VectorTiles<
    V,
    const KEY_VECTORS: usize,
    const COLUMN_VECTORS: usize,
    const STEP_VECTORS: usize,
>(std::marker::PhantomData<V>);

/// AVX-512: 32-key score tiles (eight registers of sums), 64-column value tiles (sixteen).
#[cfg(target_arch = "x86_64")]
pub(super) type Avx512Tiles = VectorTiles<std::arch::x86_64::__m512, 2, 4, 1>;
/// AVX2: 16-key score tiles and 16-column value tiles, eight registers of sums each.
#[cfg(target_arch = "x86_64")]
pub(super) type Avx2Tiles = VectorTiles<std::arch::x86_64::__m256, 2, 2, 2>;
/// NEON: 16-key score tiles and 16-column value tiles, sixteen of the 32 registers of sums
/// each.
#[cfg(target_arch = "aarch64")]
pub(super) type BaselineTiles = VectorTiles<std::arch::aarch64::float32x4_t, 4, 4, 4>;
/// Elsewhere (x86-64's SSE2): 8-key score tiles (eight of its sixteen registers), 16-column
/// value tiles.
#[cfg(not(target_arch = "aarch64"))]
pub(super) type BaselineTiles = VectorTiles<PlainLanes, 2, 4, 4>;

impl<V: Vector, const KEY_VECTORS: usize, const COLUMN_VECTORS: usize, const STEP_VECTORS: usize>
    Tiles for VectorTiles<V, KEY_VECTORS, COLUMN_VECTORS, STEP_VECTORS>
{
    const KEYS: usize = KEY_VECTORS * V::LANES;
    const COLUMNS: usize = {
        assert!(STEP_VECTORS * V::LANES == LANES);
        let columns = COLUMN_VECTORS * V::LANES;
        assert!(columns.is_multiple_of(LANES) && columns <= MAX_COLUMNS);
        columns
    };

    #[inline(always)]
    unsafe fn score_tile(
        query: &[[f32; ROWS]],
        keys: &[f32],
        scale: f32,
        scores: &mut [f32],
        stride: usize,
    ) {
        let width = Self::KEYS;
        assert!(keys.len() >= query.len() * width && scores.len() >= (ROWS - 1) * stride + width);
        // SAFETY (every block): the level's instructions are the caller's contract; key block
        // `d` ends at `(d + 1) * KEYS <= keys.len()`, and row `r` of the scores has `KEYS`
        // places (both asserted above).
        let mut sums = [[unsafe { V::zero() }; KEY_VECTORS]; ROWS];
        for (d, q) in query.iter().enumerate() {
            let mut block = [unsafe { V::zero() }; KEY_VECTORS];
            for (v, key) in block.iter_mut().enumerate() {
                *key = unsafe { V::load(keys.as_ptr().add(d * width + v * V::LANES)) };
            }
            for (sum, &q) in sums.iter_mut().zip(q) {
                let q = unsafe { V::splat(q) };
                for (s, &k) in sum.iter_mut().zip(&block) {
                    *s = unsafe { q.multiply_add(k, *s) };
                }
            }
        }
        let scale = unsafe { V::splat(scale) };
        for (r, sum) in sums.iter().enumerate() {
            for (v, &sum) in sum.iter().enumerate() {
                unsafe {
                    let at = scores.as_mut_ptr().add(r * stride + v * V::LANES);
                    sum.mul(scale).store(at);
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn value_tile(
        weights: &[&[f32]; ROWS],
        values: &ValueRows,
        column: usize,
        columns: usize,
        sums: &mut [[f32; MAX_COLUMNS]; ROWS],
    ) {
        // SAFETY: the caller's contract, with `columns` `COLUMNS` or `LANES`.
        unsafe {
            match columns == Self::COLUMNS {
                true => value_tile::<V, COLUMN_VECTORS>(weights, values, column, sums),
                false => value_tile::<V, STEP_VECTORS>(weights, values, column, sums),
            }
        }
    }
}

/// [`Tiles::value_tile`] over `N` vectors of columns.
///
/// # Safety
/// As [`Tiles::value_tile`], with `columns = N * V::LANES`.
#[inline(always)]
unsafe fn value_tile<V: Vector, const N: usize>(
    weights: &[&[f32]; ROWS],
    values: &ValueRows,
    column: usize,
    sums: &mut [[f32; MAX_COLUMNS]; ROWS],
) {
    let (width, values) = (values.width, &values.data);
    let positions = weights[0].len();
    assert!(weights.iter().all(|w| w.len() == positions));
    assert!(column + N * V::LANES <= width && values.len() >= positions * width);
    const { assert!(N * V::LANES <= MAX_COLUMNS) };
    // SAFETY (every block): the level's instructions are the caller's contract; row
    // `position` lies within `values` and the tile's columns within the row, and
    // `position < positions`, every weight slice's length (all asserted above).
    let mut tile = [[unsafe { V::zero() }; N]; ROWS];
    for position in 0..positions {
        let row = unsafe { values.as_ptr().add(position * width + column) };
        let mut value = [unsafe { V::zero() }; N];
        for (v, value) in value.iter_mut().enumerate() {
            *value = unsafe { V::load(row.add(v * V::LANES)) };
        }
        for (sum, weights) in tile.iter_mut().zip(weights) {
            let weight = unsafe { V::splat(*weights.get_unchecked(position)) };
            for (s, &v) in sum.iter_mut().zip(&value) {
                *s = unsafe { weight.multiply_add(v, *s) };
            }
        }
    }
    for (sums, tile) in sums.iter_mut().zip(&tile) {
        for (v, &vector) in tile.iter().enumerate() {
            // SAFETY: `N * V::LANES <= MAX_COLUMNS` (asserted above).
            unsafe { vector.store(sums.as_mut_ptr().add(v * V::LANES)) };
        }
    }
}
