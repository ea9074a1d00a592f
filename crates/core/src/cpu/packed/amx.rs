//! Products on Intel AMX tiles: bf16 activations times bf16 weights with f32 sums, one
//! `tdpbf16ps` multiplying a 16 x 32 block of activations by a 32 x 16 block of weights
//! (Intel's Instruction Set Extensions reference, "Intel Advanced Matrix Extensions").
//!
//! A step keeps 32 x 32 outputs (two row tiles times a panel's two column halves) in four of
//! the eight tile registers and loads two activation tiles and two weight tiles per 32 inputs,
//! so each tile loaded is multiplied twice (oneDNN's AMX kernels block the same way). Tiles read
//! memory a row of 64 bytes at a time, rows a stride apart, so both operands are laid out for
//! them: the activations in bf16, each step's two tiles contiguous ([`Bf16Rows`]), and each
//! panel block's weights, once per row block, as input pairs ([`pair_rows`], the order
//! `tdpbf16ps` reads). Sums are exact f32
//! sums of products of bf16 values, as with the `vdpbf16ps` pair kernel (both flush bf16
//! subnormals to zero).
//!
//! Linux gives a process the tiles' 8 KiB of register state only once asked to
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), which [`available`] does once. The instructions are
//! inline assembly: Rust's AMX intrinsics and AMX feature detection are unstable.

use std::arch::asm;
use std::arch::x86_64::*;
use std::ops::Range;
use std::sync::OnceLock;

use super::avx512::{interleave_pairs, load_bf16_row, store_row_avx512};
use super::prefetch::prefetch_to_l2;
use super::strips::{Bf16Rows, STEP_DEPTH as DEPTH, STEP_ROWS as ROWS, STEP_VALUES};
use super::{Element, PANEL, PanelRow, Product, Start};

/// Fewest activation rows a product takes to run on the tiles (fewer run on the AVX-512
/// kernels): at 10 rows of a 768 x 2048 product the tiles and the `vdpbf16ps` pair kernel ran
/// at 193 and 173 GFLOP/s, at 16 rows 262 and 178, at 24 rows 423 and 182 (two threads).
pub(super) const MIN_ROWS: usize = 16;
/// Rows of a tile.
const TILE_ROWS: usize = 16;
/// Rows per block: the panel block's pair rows are rearranged once a row block, whose
/// activations (512 KiB at the largest depth block) stay in L2 (2 MiB a core on every CPU with
/// AMX so far). Blocks of 256 rows made Llama-shaped 8 x 128 calls 3 % slower.
const ROW_BLOCK: usize = 16 * ROWS;
/// Most inputs a depth block takes: a panel block's pair rows (64 bytes an input) fill at most
/// 32 KiB, within L1 beside the activation tiles streaming from L2.
const MAX_DEPTH_BLOCK: usize = 512;

/// Whether this CPU has AMX with bf16 and the operating system lets this process use the
/// tiles (asked once).
pub(super) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| cpu_has_amx_bf16() && tiles_granted())
}

/// CPUID leaf 7: AMX-BF16 (EDX bit 22) and AMX-TILE (bit 24), beside AVX-512 F, BW and BF16
/// (the rearranging of operands and the stores; every CPU with AMX has them).
fn cpu_has_amx_bf16() -> bool {
    use std::arch::is_x86_feature_detected as has;
    const AMX_BF16_AND_TILE: u32 = (1 << 22) | (1 << 24);
    __cpuid(0).eax >= 7
        && __cpuid_count(7, 0).edx & AMX_BF16_AND_TILE == AMX_BF16_AND_TILE
        && has!("avx512f")
        && has!("avx512bw")
        && has!("avx512bf16")
}

/// Asks Linux for the tile data state (`XFEATURE_XTILEDATA`) for this process.
#[cfg(target_os = "linux")]
fn tiles_granted() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: the request changes only which register state the kernel lets this process use;
    // an older kernel or a CPU without the state refuses it.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn tiles_granted() -> bool {
    false
}

/// Two inputs' weights for a panel's 32 columns, as `tdpbf16ps` reads them: lane `j` of the
/// first 16 is `(w[2i][j], w[2i + 1][j])`, of the last 16 the same for column `16 + j`.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct PairRow([u32; PANEL]);

/// Rewrites `pairs` as the pair rows of a bf16 panel block (`rows`, one an input), padded with
/// zero pairs to whole [`DEPTH`]s.
///
/// `E` must be bf16 (else the pairs are of other bits).
#[target_feature(enable = "avx512f,avx512bw")]
fn pair_rows<E: Element>(rows: &[PanelRow<E>], pairs: &mut Vec<PairRow>) {
    pairs.clear();
    for two in rows.chunks(2) {
        let odd = two
            .get(1)
            .map_or(_mm512_setzero_si512(), |row| load_bf16_row(row));
        let even = load_bf16_row(&two[0]);
        // SAFETY: both are 64-byte vectors of any bits.
        pairs.push(unsafe {
            std::mem::transmute::<[__m512i; 2], PairRow>(interleave_pairs(even, odd))
        });
    }
    pairs.resize(rows.len().next_multiple_of(DEPTH) / 2, PairRow([0; PANEL]));
}

/// The tile configuration: palette 1, all eight tiles 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    const ALL_FULL: TileConfig = {
        let mut bytes = [0; 64];
        bytes[0] = 1;
        let mut tile = 0;
        while tile < 8 {
            // Bytes per row (16-bit, from byte 16), rows (8-bit, from byte 48).
            bytes[16 + 2 * tile] = 64;
            bytes[48 + tile] = TILE_ROWS as u8;
            tile += 1;
        }
        TileConfig(bytes)
    };
}

/// The tiles configured on this thread while it lives; released (back to their initial state,
/// which the kernel need not save) when dropped.
struct Tiles;

impl Tiles {
    /// Configures the tiles.
    ///
    /// # Safety
    /// [`available`] must have returned true.
    unsafe fn configure() -> Self {
        // SAFETY: the caller's contract; the configuration is valid for palette 1.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) TileConfig::ALL_FULL.0.as_ptr(), options(nostack, readonly))
        };
        Tiles
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured (`Tiles::configure`).
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// 32 x 32 sums, rows 128 bytes apart (where the tiles store them).
#[repr(C, align(64))]
struct Sums([[f32; PANEL]; ROWS]);

/// The sums of the 32 activation rows of `steps` ([`Bf16Rows::step`]) times `pairs` (whole
/// [`DEPTH`]s of pair rows), into `sums`; asks L2 for the panel rows `upcoming` on the way,
/// spread over the steps.
///
/// # Safety
/// The tiles must be configured ([`Tiles`]).
unsafe fn multiply_rows<E: Element>(
    steps: &[u16],
    pairs: &[PairRow],
    upcoming: &[PanelRow<E>],
    sums: &mut Sums,
) {
    let row_bytes = DEPTH * std::mem::size_of::<u16>();
    let count = pairs.len() / (DEPTH / 2);
    let steps = &steps[..count * STEP_VALUES];
    let mut upcoming = upcoming.chunks(upcoming.len().div_ceil(count.max(1)).max(1));
    // SAFETY (every block): the caller's contract; the tiles read 16 rows of 64 bytes from
    // the step's values and the pair rows, which lie inside, and store 16 rows of 64 bytes
    // into `sums`.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        for (a, b) in steps
            .chunks_exact(STEP_VALUES)
            .zip(pairs.chunks_exact(DEPTH / 2))
        {
            upcoming
                .next()
                .into_iter()
                .flatten()
                .for_each(prefetch_to_l2);
            asm!(
                "tileloadd tmm4, [{a_top} + {a_stride} * 1]",
                "tileloadd tmm6, [{b_low} + {b_stride} * 1]",
                "tileloadd tmm7, [{b_high} + {b_stride} * 1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{a_bottom} + {a_stride} * 1]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a_top = in(reg) a.as_ptr(),
                a_bottom = in(reg) a[TILE_ROWS * DEPTH..].as_ptr(),
                a_stride = in(reg) row_bytes,
                b_low = in(reg) b.as_ptr(),
                b_high = in(reg) b.as_ptr().cast::<u8>().add(64),
                b_stride = in(reg) std::mem::size_of::<PairRow>(),
                options(nostack, readonly)
            );
        }
        let rows = sums.0.as_mut_ptr();
        let at = |row: usize, column: usize| rows.add(row).cast::<f32>().add(column);
        asm!(
            "tilestored [{top_low} + {stride} * 1], tmm0",
            "tilestored [{top_high} + {stride} * 1], tmm1",
            "tilestored [{bottom_low} + {stride} * 1], tmm2",
            "tilestored [{bottom_high} + {stride} * 1], tmm3",
            top_low = in(reg) at(0, 0),
            top_high = in(reg) at(0, 16),
            bottom_low = in(reg) at(TILE_ROWS, 0),
            bottom_high = in(reg) at(TILE_ROWS, 16),
            stride = in(reg) std::mem::size_of::<[f32; PANEL]>(),
            options(nostack)
        );
    }
}

/// The inputs per block: the fewest equal blocks of at most [`MAX_DEPTH_BLOCK`], each whole
/// [`DEPTH`]s (so that a block's last tile reads no input of the next block).
fn depth_block(d_in: usize) -> usize {
    let blocks = d_in.div_ceil(MAX_DEPTH_BLOCK).max(1);
    d_in.div_ceil(blocks).next_multiple_of(DEPTH).max(DEPTH)
}

/// Computes `product`'s outputs of rows `row_range` (starting on a multiple of [`ROWS`]) in
/// the columns of `panels`, from the activations `rows`.
///
/// # Safety
/// [`available`] must have returned true, `E` must be bf16, and `rows` must be the product's
/// activations.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn panels<E: Element>(
    product: &Product<'_, E>,
    rows: &Bf16Rows,
    row_range: Range<usize>,
    panels: Range<usize>,
) {
    debug_assert_eq!(row_range.start % ROWS, 0);
    let depth_block = depth_block(product.d_in);
    let mut pairs = Vec::with_capacity(depth_block / 2);
    let mut sums = Sums([[0.0; PANEL]; ROWS]);
    // SAFETY: the caller's contract.
    let _tiles = unsafe { Tiles::configure() };
    for depth_start in (0..product.d_in.max(1)).step_by(depth_block) {
        for row_start in row_range.clone().step_by(ROW_BLOCK) {
            let row_end = (row_start + ROW_BLOCK).min(row_range.end);
            for panel in panels.clone() {
                pair_rows(product.block(panel, depth_start, depth_block), &mut pairs);
                let first_column = panel * PANEL;
                let columns = PANEL.min(product.d_out - first_column);
                let start = match depth_start {
                    0 => Start::Bias(product.bias.map(|bias| &bias[first_column..])),
                    _ => Start::Accumulate,
                };
                // The block the task reads next, a share of it for each step of rows.
                let next = product.next_block(
                    panel,
                    &panels,
                    row_end < row_range.end,
                    depth_start..depth_start + depth_block,
                );
                let steps = (row_end - row_start).div_ceil(ROWS);
                let mut shares = next.chunks(next.len().div_ceil(steps).max(1));
                for first_row in (row_start..row_end).step_by(ROWS) {
                    let upcoming = shares.next().unwrap_or(&[]);
                    // SAFETY: the tiles are configured.
                    unsafe {
                        let steps = rows.step(first_row, depth_start);
                        multiply_rows(steps, &pairs, upcoming, &mut sums);
                    }
                    for (row, sum) in (first_row..row_end.min(first_row + ROWS)).zip(&sums.0) {
                        // SAFETY: the row and its `columns` lie inside the `rows x d_out`
                        // output; this task alone writes them.
                        unsafe {
                            let out = product.output.0.add(row * product.d_out + first_column);
                            let sum = [
                                _mm512_load_ps(sum.as_ptr()),
                                _mm512_load_ps(sum[16..].as_ptr()),
                            ];
                            store_row_avx512(sum, out, columns, start);
                        }
                    }
                }
            }
        }
    }
}
