//! The AVX-512 product kernels: f32 sums of widened panel rows (`avx512`), and bf16 pairs on
//! `vdpbf16ps` (`avx512-bf16`), both `R x 32` outputs in `2R` registers, one pass over a tile's
//! block of panel rows. The AMX kernel shares their bf16 loads, pair interleave and stores.

use super::prefetch::{Upcoming, prefetch_ahead};
use super::{Element, PanelRow, Start, Tile};
use crate::precision::WeightDtype;

/// A panel row's 32 weights widened to f32: columns 0..16 and 16..32.
///
/// # Safety
/// The CPU must have AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
fn widen_row<E: Element>(
    row: &PanelRow<E>,
) -> (std::arch::x86_64::__m512, std::arch::x86_64::__m512) {
    use std::arch::x86_64::*;
    let bytes = row.0.as_ptr().cast::<u8>();
    // SAFETY: a panel row is 64-byte aligned and holds 32 elements (128 bytes of f32, 64 of
    // bf16/f16): every load below stays inside it, at its alignment.
    unsafe {
        match E::DTYPE {
            WeightDtype::F32 => (
                _mm512_load_ps(bytes.cast()),
                _mm512_load_ps(bytes.add(64).cast()),
            ),
            // Each 32-bit lane holds column `j` in its low half and `16 + j` in its high half
            // (`Element::slot`); a bf16 is the high half of the f32 it rounds.
            WeightDtype::Bf16 => {
                let pairs = _mm512_load_si512(bytes.cast());
                (
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(pairs)),
                    _mm512_castsi512_ps(_mm512_and_si512(
                        pairs,
                        _mm512_set1_epi32(0xffff_0000_u32 as i32),
                    )),
                )
            }
            WeightDtype::F16 => (
                _mm512_cvtph_ps(_mm256_load_si256(bytes.cast())),
                _mm512_cvtph_ps(_mm256_load_si256(bytes.add(32).cast())),
            ),
        }
    }
}

/// The AVX-512 kernel: `R x 32` sums in 2R registers.
///
/// # Safety
/// The CPU must have AVX-512F, `strip` must hold `tile.weights.len() * R` floats, and
/// `tile.output` must address `R` rows of `tile.columns` writable floats, `tile.stride` apart.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tile_avx512<const R: usize, E: Element>(tile: &Tile<'_, E>, strip: &[f32]) {
    use std::arch::x86_64::*;
    debug_assert_eq!(strip.len(), tile.weights.len() * R);
    let mut sums = [[_mm512_setzero_ps(); 2]; R];
    let mut upcoming = Upcoming::over(tile.upcoming, tile.weights.len());
    for (row, x) in tile.weights.iter().zip(strip.as_chunks::<R>().0) {
        prefetch_ahead::<R, E>(row);
        upcoming.step();
        let (low, high) = widen_row(row);
        for (sum, &x) in sums.iter_mut().zip(x) {
            let x = _mm512_set1_ps(x);
            sum[0] = _mm512_fmadd_ps(x, low, sum[0]);
            sum[1] = _mm512_fmadd_ps(x, high, sum[1]);
        }
    }
    // SAFETY: the caller's contract.
    unsafe { store_avx512(sums, tile) }
}

/// The AVX-512 BF16 kernel: `R x 32` sums in 2R registers, two inputs per `vdpbf16ps`.
///
/// Two consecutive bf16 panel rows (inputs `2i` and `2i + 1`) hold, in lane `j`, columns `j`
/// and `16 + j` each (`Element::slot`); one shift and one blend per half make the pairs
/// `(w[2i][j], w[2i + 1][j])` that meet the strip's `(x[2i], x[2i + 1])`.
///
/// # Safety
/// The CPU must have AVX-512F, BW and BF16, `E` must be bf16, `pairs` must hold
/// `tile.weights.len().div_ceil(2) * R` pairs, and `tile.output` must address `R` rows of
/// `tile.columns` writable floats, `tile.stride` apart.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn tile_avx512_bf16<const R: usize, E: Element>(
    tile: &Tile<'_, E>,
    pairs: &[u32],
) {
    use std::arch::x86_64::*;
    debug_assert_eq!(E::DTYPE, WeightDtype::Bf16);
    debug_assert_eq!(pairs.len(), tile.weights.len().div_ceil(2) * R);
    // SAFETY: both are 512-bit vectors; `__m512bh` is 32 bf16 values, any bits.
    let as_bf16 = |v: __m512i| unsafe { std::mem::transmute::<__m512i, __m512bh>(v) };
    let mut sums = [[_mm512_setzero_ps(); 2]; R];
    let mut step = |even: __m512i, odd: __m512i, x: &[u32; R]| {
        let [low, high] = interleave_pairs(even, odd);
        let (low, high) = (as_bf16(low), as_bf16(high));
        for (sum, &x) in sums.iter_mut().zip(x) {
            let x = as_bf16(_mm512_set1_epi32(x as i32));
            sum[0] = _mm512_dpbf16_ps(sum[0], x, low);
            sum[1] = _mm512_dpbf16_ps(sum[1], x, high);
        }
    };
    let mut rows = tile.weights.chunks_exact(2);
    let mut x = pairs.as_chunks::<R>().0.iter();
    let mut upcoming = Upcoming::over(tile.upcoming, rows.len());
    for (two, x) in rows.by_ref().zip(x.by_ref()) {
        prefetch_ahead::<R, E>(&two[0]);
        prefetch_ahead::<R, E>(&two[1]);
        upcoming.step();
        step(load_bf16_row(&two[0]), load_bf16_row(&two[1]), x);
    }
    if let ([last], Some(x)) = (rows.remainder(), x.next()) {
        step(load_bf16_row(last), _mm512_setzero_si512(), x);
    }
    // SAFETY: the caller's contract.
    unsafe { store_avx512(sums, tile) }
}

/// A bf16 panel row's 64 bytes (the first 64 of any panel row).
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn load_bf16_row<E: Element>(row: &PanelRow<E>) -> std::arch::x86_64::__m512i {
    debug_assert_eq!(E::DTYPE, WeightDtype::Bf16);
    // SAFETY: every panel row is at least 64 bytes, 64-byte aligned.
    unsafe { std::arch::x86_64::_mm512_load_si512(row.0.as_ptr().cast()) }
}

/// Two consecutive bf16 panel rows (inputs `2i` and `2i + 1`, lane `j` holding columns `j` and
/// `16 + j`: `Element::slot`) as input pairs: lane `j` of the first vector is
/// `(w[2i][j], w[2i + 1][j])`, of the second the same for column `16 + j` (what `vdpbf16ps`
/// and AMX's `tdpbf16ps` multiply). One shift and one blend a vector.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
pub(super) fn interleave_pairs(
    even: std::arch::x86_64::__m512i,
    odd: std::arch::x86_64::__m512i,
) -> [std::arch::x86_64::__m512i; 2] {
    use std::arch::x86_64::*;
    // The high 16-bit half of every 32-bit lane.
    const HIGH_HALVES: __mmask32 = 0xaaaa_aaaa;
    [
        _mm512_mask_blend_epi16(HIGH_HALVES, even, _mm512_slli_epi32::<16>(odd)),
        _mm512_mask_blend_epi16(HIGH_HALVES, _mm512_srli_epi32::<16>(even), odd),
    ]
}

/// Adds a tile's sums to its start (bias, zero or the partial sums) and stores them. Always
/// inlined into the kernels (so it carries no `target_feature` of its own, which would keep it a
/// call): a call passes the sums through memory, and one that took their address kept them
/// there through the kernel's loop (twice the time of a prompt call).
///
/// # Safety
/// The CPU must have AVX-512F, and `tile.output` must address `R` rows of `tile.columns`
/// writable floats, `tile.stride` apart.
#[inline(always)]
unsafe fn store_avx512<const R: usize, E: Element>(
    sums: [[std::arch::x86_64::__m512; 2]; R],
    tile: &Tile<'_, E>,
) {
    for (r, &sum) in sums.iter().enumerate() {
        // SAFETY: the caller's contract, for row `r`.
        unsafe {
            store_row_avx512(
                sum,
                tile.output.add(r * tile.stride),
                tile.columns,
                tile.start,
            )
        }
    }
}

/// Adds one output row's sums (`columns` of them, at most 32) to its start (bias, zero or the
/// partial sums at `out`) and stores them at `out`.
///
/// # Safety
/// The CPU must have AVX-512F, and `out` must address `columns` writable floats.
#[inline(always)]
pub(super) unsafe fn store_row_avx512(
    sum: [std::arch::x86_64::__m512; 2],
    out: *mut f32,
    columns: usize,
    start: Start<'_>,
) {
    use std::arch::x86_64::*;
    let low_mask: __mmask16 = lane_mask(columns.min(16));
    let high_mask: __mmask16 = lane_mask(columns.saturating_sub(16));
    // SAFETY: masked loads and stores touch only the row's `columns` floats; the high half's
    // address is formed with `wrapping_add` since it may lie past them.
    unsafe {
        let (base_low, base_high) = match start {
            Start::Bias(None) => (_mm512_setzero_ps(), _mm512_setzero_ps()),
            Start::Bias(Some(bias)) => (
                _mm512_maskz_loadu_ps(low_mask, bias.as_ptr()),
                _mm512_maskz_loadu_ps(high_mask, bias.as_ptr().wrapping_add(16)),
            ),
            Start::Accumulate => (
                _mm512_maskz_loadu_ps(low_mask, out),
                _mm512_maskz_loadu_ps(high_mask, out.wrapping_add(16)),
            ),
        };
        _mm512_mask_storeu_ps(out, low_mask, _mm512_add_ps(sum[0], base_low));
        _mm512_mask_storeu_ps(
            out.wrapping_add(16),
            high_mask,
            _mm512_add_ps(sum[1], base_high),
        );
    }
}

/// A mask of the first `lanes` (at most 16) lanes.
fn lane_mask(lanes: usize) -> u16 {
    ((1u32 << lanes) - 1) as u16
}
