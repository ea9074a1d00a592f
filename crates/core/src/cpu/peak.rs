//! The f32 arithmetic peak at the vector level the kernels run at: benchmark reports divide a
//! call's multiply-adds by it, so it must be the peak of the instructions the kernels were
//! allowed (`HOOKSCOPE_CPU_KERNELS=avx2` on an AVX-512 CPU measures the AVX2 peak).

use super::isa::{VectorLevel, vector_level};

/// `rounds` multiply-adds (fused where the level has them) on each of a number of independent
/// sums, at the vector level the kernels run at; returns their total, so that nothing is
/// optimised away, and how many sums there were. The sums are enough vectors that the
/// multiply-adds never wait on each other and few enough to stay in registers (24 of
/// AVX-512's 32 registers of 16 lanes, 12 of AVX2's 16 of 8, 8 of the baseline's 4-lane
/// registers): more would spill, and the probe would measure the spills.
pub fn multiply_add_rounds(rounds: usize) -> (f32, usize) {
    #[cfg(target_arch = "x86_64")]
    const AVX512_SUMS: usize = 24 * 16;
    #[cfg(target_arch = "x86_64")]
    const AVX2_SUMS: usize = 12 * 8;
    const BASELINE_SUMS: usize = 8 * 4;
    match vector_level() {
        // SAFETY: `vector_level` found AVX-512F and FMA on this CPU.
        #[cfg(target_arch = "x86_64")]
        VectorLevel::Avx512 => (unsafe { rounds_avx512::<AVX512_SUMS>(rounds) }, AVX512_SUMS),
        // SAFETY: `vector_level` found AVX2 and FMA on this CPU.
        #[cfg(target_arch = "x86_64")]
        VectorLevel::Avx2 => (unsafe { rounds_avx2::<AVX2_SUMS>(rounds) }, AVX2_SUMS),
        // x86-64's baseline has no fused multiply-add; every aarch64 CPU has.
        VectorLevel::Baseline => (
            rounds_on::<BASELINE_SUMS>(rounds, cfg!(target_arch = "aarch64")),
            BASELINE_SUMS,
        ),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn rounds_avx512<const SUMS: usize>(rounds: usize) -> f32 {
    rounds_on::<SUMS>(rounds, true)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn rounds_avx2<const SUMS: usize>(rounds: usize) -> f32 {
    rounds_on::<SUMS>(rounds, true)
}

/// The probe's loop, vectorised by the compiler at the caller's level.
#[inline(always)]
fn rounds_on<const SUMS: usize>(rounds: usize, fused: bool) -> f32 {
    let (scale, shift) = std::hint::black_box((0.999_999f32, 1e-7f32));
    let mut sums = [0.0f32; SUMS];
    for _ in 0..rounds {
        for sum in sums.iter_mut() {
            *sum = if fused {
                sum.mul_add(scale, shift)
            } else {
                *sum * scale + shift
            };
        }
    }
    sums.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe computes what its loop says: each sum is the affine map applied `rounds`
    /// times to zero, at whatever level this process runs.
    #[test]
    fn the_probe_sums_its_rounds() {
        let (total, sums) = multiply_add_rounds(3);
        let one = ((0.0f32 * 0.999_999 + 1e-7) * 0.999_999 + 1e-7) * 0.999_999 + 1e-7;
        assert!(sums >= 32);
        // Summing the sums in f32 rounds once per sum.
        let expected = one * sums as f32;
        assert!(
            (total - expected).abs() <= 1e-4 * expected,
            "{total} against {expected}"
        );
    }
}
