//! What the product kernels ask the caches to fetch ahead of them: the next block of a task's
//! panel rows into L2, spread over a tile's pass ([`Upcoming`]), and on x86_64 the panel rows a
//! little ahead of the kernel into L1 ([`prefetch_ahead`]).

#[cfg(test)]
use super::PANEL;
use super::{Element, PanelRow};
#[cfg(target_arch = "x86_64")]
use crate::precision::WeightDtype;

/// Bytes of panel rows ahead of the kernel that it asks the cache to fetch, in a tile of more
/// than [`STREAMING_ROWS`] rows: these compute long enough on each panel row (whose block
/// [`Upcoming`] brought to L2) for a request 16 f32 rows ahead to arrive in time.
#[cfg(target_arch = "x86_64")]
const PREFETCH_BYTES: usize = 2048;
/// The same for a tile of f32 weights and at most [`STREAMING_ROWS`] rows (a decode step),
/// which streams its weights from memory a few cycles a panel row and must ask farther ahead to
/// cover memory's latency. One thread, weights not in cache, GPT-2-small's decode matrices
/// (Intel Xeon, AVX-512): one row 11.5-11.7 GB/s with 2048 bytes, 12.2-12.7 with 8192,
/// 11.8-12.0 with 16384; two rows 10.9 against 11.6-12.0; four rows even; twelve rows 10.3
/// against 9.4 (2048 better). bf16 and f16 rows (half the bytes) showed no gain, and a GPT-2
/// f16 decode step took 5-10 % longer with 8192.
#[cfg(target_arch = "x86_64")]
const STREAMING_PREFETCH_BYTES: usize = 8192;
/// The most rows of a tile that streams its weights ([`STREAMING_PREFETCH_BYTES`]).
#[cfg(target_arch = "x86_64")]
const STREAMING_ROWS: usize = 2;

/// Fewest inputs between two of a tile's requests for the next block: one panel row (two cache
/// lines in f32) every 12-24 cycles keeps the misses in flight within the core's fill buffers.
const UPCOMING_SPACING: usize = 4;

/// The panel rows a tile asks L2 to fetch for its task's next tiles ([`Tile::upcoming`](super::Tile::upcoming)),
/// spread over one pass of the tile's inputs: the second pass of a half-panel kernel (AVX2,
/// NEON; the first reads the tile's own block, from memory in a block's first tile), the one
/// pass of an AVX-512 kernel. A tile whose share does not fit one pass goes on in the next.
///
/// Without it the first tile of every panel block waited on memory for all of the block. Alone
/// (depth blocks of 256), with weights not in cache, two threads, 128 rows, it took AVX2
/// products from 186-202 to 196-221 GFLOP/s and Llama-shaped 128-token calls 5 % faster; with
/// the depth blocks of [`depth_block`](super::depth_block), see `BENCHMARKS.md`. The bf16 pair kernel ran at the
/// same speed with and without it.
pub(super) struct Upcoming<'a, E> {
    rows: std::slice::Iter<'a, PanelRow<E>>,
    /// Inputs between two requests.
    every: usize,
    /// Inputs until the next request.
    countdown: usize,
}

impl<'a, E: Element> Upcoming<'a, E> {
    /// Requests for `rows` (a tile's [`Tile::upcoming`](super::Tile::upcoming)), spread over `inputs` calls of
    /// [`Upcoming::step`].
    pub(super) fn over(rows: &'a [PanelRow<E>], inputs: usize) -> Self {
        Upcoming {
            rows: rows.iter(),
            every: (inputs / rows.len().max(1)).max(UPCOMING_SPACING),
            countdown: 0,
        }
    }

    /// Called once an input: asks for the next panel row every `every` inputs.
    #[inline(always)]
    pub(super) fn step(&mut self) {
        if self.countdown == 0 {
            if let Some(row) = self.rows.next() {
                prefetch_to_l2(row);
            }
            self.countdown = self.every;
        }
        self.countdown -= 1;
    }
}

/// Asks L2 for the panel row `row`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_to_l2<E: Element>(row: &PanelRow<E>) {
    use std::arch::x86_64::*;
    let at = (row as *const PanelRow<E>).cast::<i8>();
    for line in 0..std::mem::size_of::<PanelRow<E>>() / 64 {
        // SAFETY: SSE is part of x86_64; the line lies inside the panel row.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(64 * line)) };
    }
}

/// Asks L2 for the panel row `row`.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub(super) fn prefetch_to_l2<E: Element>(row: &PanelRow<E>) {
    let at = (row as *const PanelRow<E>).cast::<u8>();
    for line in 0..std::mem::size_of::<PanelRow<E>>() / 64 {
        // SAFETY: `prfm` is a hint: it never faults and changes nothing the program observes.
        unsafe {
            std::arch::asm!(
                "prfm pldl2keep, [{at}]",
                at = in(reg) at.wrapping_add(64 * line),
                options(nostack, preserves_flags, readonly),
            )
        };
    }
}

/// Asks the cache for the panel rows some bytes past `row`, for a tile of `R` rows:
/// [`STREAMING_PREFETCH_BYTES`] in f32 up to [`STREAMING_ROWS`] rows, else [`PREFETCH_BYTES`]
/// (prefetches never fault, so the address may lie past the panel).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn prefetch_ahead<const R: usize, E: Element>(row: &PanelRow<E>) {
    use std::arch::x86_64::*;
    let distance = if R <= STREAMING_ROWS && E::DTYPE == WeightDtype::F32 {
        STREAMING_PREFETCH_BYTES
    } else {
        PREFETCH_BYTES
    };
    let ahead = (row as *const PanelRow<E>)
        .cast::<i8>()
        .wrapping_add(distance);
    for line in 0..std::mem::size_of::<PanelRow<E>>() / 64 {
        // SAFETY: SSE is part of x86_64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tile's share of the next block is asked for one panel row at a time, spread over one
    /// pass's inputs, never closer than `UPCOMING_SPACING` inputs apart: a share too large for
    /// one pass goes on in the next.
    #[test]
    fn the_next_block_is_asked_for_spread_over_a_pass() {
        let rows = vec![PanelRow([0.0_f32; PANEL]); 100];
        let asked_after = |share: usize, steps: usize| {
            let mut upcoming = Upcoming::over(&rows[..share], 256);
            (0..steps).for_each(|_| upcoming.step());
            share - upcoming.rows.len()
        };
        // 20 rows over 256 inputs: one every 12 inputs, the first at once.
        assert_eq!(asked_after(20, 1), 1);
        assert_eq!(asked_after(20, 12), 1);
        assert_eq!(asked_after(20, 13), 2);
        assert_eq!(asked_after(20, 229), 20);
        assert_eq!(asked_after(20, 256), 20);
        // 100 rows: one every `UPCOMING_SPACING` inputs, 64 in the first pass, all in the second.
        assert_eq!(asked_after(100, 256), 256 / UPCOMING_SPACING);
        assert_eq!(asked_after(100, 512), 100);
        assert_eq!(asked_after(0, 256), 0);
    }
}
