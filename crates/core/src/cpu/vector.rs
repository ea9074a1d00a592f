//! One vector register of `f32` lanes for each instruction set, behind one trait, so that a
//! register tile is written once and compiled for every level: AVX-512 (`__m512`), AVX2 with
//! FMA (`__m256`), NEON (`float32x4_t`) and, where the baseline is not NEON, `PlainLanes`: four
//! floats the compiler maps onto whatever the target has (SSE2 on x86-64).
//!
//! The methods are always inlined, so that they take on the target features of the function
//! they end up in: code written over a [`Vector`] runs inside a function compiled for its
//! level (`#[target_feature]`, as `isa::per_vector_level` and the attention kernels' entry
//! points are), where each method is one instruction.

/// A vector register of [`Vector::LANES`] floats.
///
/// # Safety
/// Every method may use its level's instructions: callers must run on a CPU that has them
/// (nothing beyond the target's baseline for `PlainLanes` and NEON).
pub(super) trait Vector: Copy {
    /// Floats in the register.
    const LANES: usize;

    /// Every lane zero.
    unsafe fn zero() -> Self;

    /// Every lane `value`.
    unsafe fn splat(value: f32) -> Self;

    /// The `LANES` floats from `from` (no alignment needed).
    ///
    /// # Safety
    /// Also: `LANES` floats from `from` must be readable.
    unsafe fn load(from: *const f32) -> Self;

    /// Writes the lanes to the `LANES` floats from `to` (no alignment needed).
    ///
    /// # Safety
    /// Also: `LANES` floats from `to` must be writable.
    unsafe fn store(self, to: *mut f32);

    /// Lane-wise `self + other`.
    unsafe fn add(self, other: Self) -> Self;

    /// Lane-wise `self * other`.
    unsafe fn mul(self, other: Self) -> Self;

    /// Lane-wise `self * factor + addend`, rounded once where the level fuses multiply-adds
    /// (every level but x86-64's baseline, which has no fused multiply-add).
    unsafe fn multiply_add(self, factor: Self, addend: Self) -> Self;
}

/// Implements [`Vector`] for a register type with one intrinsic an operation (`$zero` an
/// expression, `$multiply_add` written over its three operands, as the intrinsic orders them).
macro_rules! vector_type {
    (
        $(#[$doc:meta])*
        $type:ty, $lanes:literal,
        zero: $zero:expr,
        splat: $splat:path,
        load: $load:path,
        store: $store:path,
        add: $add:path,
        mul: $mul:path,
        multiply_add: |$a:ident, $b:ident, $c:ident| $multiply_add:expr $(,)?
    ) => {
        $(#[$doc])*
        impl Vector for $type {
            const LANES: usize = $lanes;

            // SAFETY (every method): the trait's contract, the level's instructions and, for
            // `load` and `store`, `LANES` floats at the pointer; the intrinsics need no
            // alignment.
            #[inline(always)]
            unsafe fn zero() -> Self {
                unsafe { $zero }
            }

            #[inline(always)]
            unsafe fn splat(value: f32) -> Self {
                unsafe { $splat(value) }
            }

            #[inline(always)]
            unsafe fn load(from: *const f32) -> Self {
                unsafe { $load(from) }
            }

            #[inline(always)]
            unsafe fn store(self, to: *mut f32) {
                unsafe { $store(to, self) }
            }

            #[inline(always)]
            unsafe fn add(self, other: Self) -> Self {
                unsafe { $add(self, other) }
            }

            #[inline(always)]
            unsafe fn mul(self, other: Self) -> Self {
                unsafe { $mul(self, other) }
            }

            #[inline(always)]
            unsafe fn multiply_add(self, factor: Self, addend: Self) -> Self {
                let ($a, $b, $c) = (self, factor, addend);
                unsafe { $multiply_add }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Vector;

    vector_type!(
        /// AVX-512F: sixteen floats.
        __m512, 16,
        zero: _mm512_setzero_ps(),
        splat: _mm512_set1_ps,
        load: _mm512_loadu_ps,
        store: _mm512_storeu_ps,
        add: _mm512_add_ps,
        mul: _mm512_mul_ps,
        multiply_add: |a, b, c| _mm512_fmadd_ps(a, b, c),
    );

    vector_type!(
        /// AVX2 with FMA: eight floats.
        __m256, 8,
        zero: _mm256_setzero_ps(),
        splat: _mm256_set1_ps,
        load: _mm256_loadu_ps,
        store: _mm256_storeu_ps,
        add: _mm256_add_ps,
        mul: _mm256_mul_ps,
        multiply_add: |a, b, c| _mm256_fmadd_ps(a, b, c),
    );
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    use super::Vector;

    vector_type!(
        /// NEON: four floats (every aarch64 CPU).
        float32x4_t, 4,
        zero: vdupq_n_f32(0.0),
        splat: vdupq_n_f32,
        load: vld1q_f32,
        store: vst1q_f32,
        add: vaddq_f32,
        mul: vmulq_f32,
        multiply_add: |a, b, c| vfmaq_f32(c, a, b),
    );
}

/// Four floats in plain Rust, for the target's baseline where it is not NEON: the compiler
/// keeps them in one SSE2 register on x86-64 (and in whatever it has elsewhere).
#[cfg(not(target_arch = "aarch64"))]
#[derive(Clone, Copy)]
pub(super) struct PlainLanes([f32; 4]);

#[cfg(not(target_arch = "aarch64"))]
impl PlainLanes {
    /// Lane-wise `op`.
    #[inline(always)]
    fn zip(self, other: Self, op: impl Fn(f32, f32) -> f32) -> Self {
        PlainLanes(std::array::from_fn(|lane| op(self.0[lane], other.0[lane])))
    }
}

#[cfg(not(target_arch = "aarch64"))]
impl Vector for PlainLanes {
    const LANES: usize = 4;

    #[inline(always)]
    unsafe fn zero() -> Self {
        PlainLanes([0.0; 4])
    }

    #[inline(always)]
    unsafe fn splat(value: f32) -> Self {
        PlainLanes([value; 4])
    }

    #[inline(always)]
    unsafe fn load(from: *const f32) -> Self {
        // SAFETY: four readable floats (the caller's contract); `read_unaligned` needs no
        // alignment.
        PlainLanes(unsafe { from.cast::<[f32; 4]>().read_unaligned() })
    }

    #[inline(always)]
    unsafe fn store(self, to: *mut f32) {
        // SAFETY: four writable floats (the caller's contract).
        unsafe { to.cast::<[f32; 4]>().write_unaligned(self.0) }
    }

    #[inline(always)]
    unsafe fn add(self, other: Self) -> Self {
        self.zip(other, |a, b| a + b)
    }

    #[inline(always)]
    unsafe fn mul(self, other: Self) -> Self {
        self.zip(other, |a, b| a * b)
    }

    /// A product and a sum, two roundings: x86-64's baseline has no fused multiply-add, and
    /// `f32::mul_add` would call libm's `fmaf` there.
    #[inline(always)]
    unsafe fn multiply_add(self, factor: Self, addend: Self) -> Self {
        // SAFETY: plain arithmetic.
        unsafe { self.mul(factor).add(addend) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation of `V` against plain arithmetic, on values whose products and sums are
    /// exact in f32 (so fused and unfused multiply-adds agree).
    fn check<V: Vector>() {
        let a: Vec<f32> = (0..V::LANES).map(|i| i as f32 - 3.5).collect();
        let b: Vec<f32> = (0..V::LANES).map(|i| 0.25 * i as f32 + 1.0).collect();
        let c: Vec<f32> = (0..V::LANES).map(|i| 8.0 - i as f32).collect();
        let lanes = |v: V| {
            let mut out = vec![f32::NAN; V::LANES];
            // SAFETY: `out` holds LANES floats; the callers run each level the CPU has.
            unsafe { v.store(out.as_mut_ptr()) };
            out
        };
        let expect = |op: fn(f32, f32, f32) -> f32| -> Vec<f32> {
            (0..V::LANES).map(|i| op(a[i], b[i], c[i])).collect()
        };
        // SAFETY: as above; each slice holds LANES floats.
        unsafe {
            let (va, vb, vc) = (
                V::load(a.as_ptr()),
                V::load(b.as_ptr()),
                V::load(c.as_ptr()),
            );
            assert_eq!(lanes(V::zero()), vec![0.0; V::LANES]);
            assert_eq!(lanes(V::splat(2.5)), vec![2.5; V::LANES]);
            assert_eq!(lanes(va), a);
            assert_eq!(lanes(va.add(vb)), expect(|a, b, _| a + b));
            assert_eq!(lanes(va.mul(vb)), expect(|a, b, _| a * b));
            assert_eq!(lanes(va.multiply_add(vb, vc)), expect(|a, b, c| a * b + c));
        }
    }

    #[test]
    fn every_vector_type_this_cpu_runs_computes_lane_by_lane() {
        #[cfg(not(target_arch = "aarch64"))]
        check::<PlainLanes>();
        #[cfg(target_arch = "aarch64")]
        check::<std::arch::aarch64::float32x4_t>();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                check::<std::arch::x86_64::__m256>();
            }
            if has!("avx512f") {
                check::<std::arch::x86_64::__m512>();
            }
        }
    }
}
