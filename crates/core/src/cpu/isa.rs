//! Which instruction-set family the CPU kernels run: the best this CPU has, capped by
//! [`KERNELS_VARIABLE`] so that every family a machine supports can be run and tested on it.
//! The packed products pick their kernel from the cap (`packed::Kernel::detect`); kernels
//! compiled once per vector level (attention, the selective scan, element-wise functions, the
//! softmax) ask [`vector_level`], most through [`per_vector_level`].

/// The environment variable that caps the CPU kernels' instruction-set family (the packed
/// products and the attention kernels): `portable`, `neon`, `avx2`, `avx512` or `amx` (unset:
/// the best this CPU has). A family the CPU lacks falls back to the best it has below it, so
/// that `HOOKSCOPE_CPU_KERNELS=avx2` on an AVX-512 machine runs, and tests, the AVX2 kernels
/// (and `portable` on aarch64 the portable ones); `avx512` leaves out the AMX tiles, which only
/// bf16 products use.
pub const KERNELS_VARIABLE: &str = "HOOKSCOPE_CPU_KERNELS";

/// The instruction-set families of the CPU kernels, in order of capability.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Family {
    Portable,
    Neon,
    Avx2,
    Avx512,
    /// AVX-512 and Intel's AMX tiles.
    Amx,
}

/// The family a value of [`KERNELS_VARIABLE`] caps the kernels at (`None`: unset); an unknown
/// value is an error naming the variable and the choices.
fn parse_family(value: Option<&str>) -> Result<Family, String> {
    match value.map(str::trim) {
        None | Some("") | Some("amx") => Ok(Family::Amx),
        Some("avx512") => Ok(Family::Avx512),
        Some("avx2") => Ok(Family::Avx2),
        Some("neon") => Ok(Family::Neon),
        Some("portable") => Ok(Family::Portable),
        Some(other) => Err(format!(
            "{KERNELS_VARIABLE}={other}: expected portable, neon, avx2, avx512 or amx"
        )),
    }
}

/// The cap [`KERNELS_VARIABLE`] sets for this process, read once.
pub(crate) fn kernel_cap() -> &'static Result<Family, String> {
    static CAP: std::sync::OnceLock<Result<Family, String>> = std::sync::OnceLock::new();
    CAP.get_or_init(|| parse_family(std::env::var(KERNELS_VARIABLE).ok().as_deref()))
}

/// Refuses an unknown [`KERNELS_VARIABLE`] value, with the message to show (models check it as
/// they load, so that a typo is never silently the default).
pub fn check_kernel_choice() -> Result<(), String> {
    kernel_cap().clone().map(|_| ())
}

/// The vector level a kernel compiled once per level runs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VectorLevel {
    /// AVX-512F with FMA: 32 registers of 16 lanes.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX2 with FMA: 16 registers of 8 lanes.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// What every CPU of the target has (SSE2 on x86-64, NEON on aarch64).
    Baseline,
}

/// The best vector level this CPU has within the family [`KERNELS_VARIABLE`] allows (read once).
pub(crate) fn vector_level() -> VectorLevel {
    static LEVEL: std::sync::OnceLock<VectorLevel> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let cap = kernel_cap().clone().unwrap_or(Family::Amx);
            if cap >= Family::Avx512 && has!("avx512f") && has!("avx512vl") && has!("fma") {
                return VectorLevel::Avx512;
            }
            if cap >= Family::Avx2 && has!("avx2") && has!("fma") {
                return VectorLevel::Avx2;
            }
        }
        VectorLevel::Baseline
    })
}

/// Defines a function compiled once per vector level (AVX-512, AVX2 and the target's baseline),
/// each copy run where [`vector_level`] allows it: what `multiversion` does, but capped by
/// [`KERNELS_VARIABLE`], so that every level this CPU has can be forced and tested. The body is
/// written once, for the compiler to vectorise at each level.
macro_rules! per_vector_level {
    (
        $(#[$attribute:meta])*
        $visibility:vis fn $name:ident $(<$($lifetime:lifetime),*>)? ($($argument:ident: $type:ty),* $(,)?)
        $body:block
    ) => {
        $(#[$attribute])*
        $visibility fn $name $(<$($lifetime),*>)? ($($argument: $type),*) {
            #[inline(always)]
            fn body $(<$($lifetime),*>)? ($($argument: $type),*) $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
            unsafe fn avx512 $(<$($lifetime),*>)? ($($argument: $type),*) {
                body($($argument),*)
            }

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2 $(<$($lifetime),*>)? ($($argument: $type),*) {
                body($($argument),*)
            }

            match $crate::cpu::isa::vector_level() {
                // SAFETY: `vector_level` found AVX-512F, AVX-512VL and FMA on this CPU.
                #[cfg(target_arch = "x86_64")]
                $crate::cpu::isa::VectorLevel::Avx512 => unsafe { avx512($($argument),*) },
                // SAFETY: `vector_level` found AVX2 and FMA on this CPU.
                #[cfg(target_arch = "x86_64")]
                $crate::cpu::isa::VectorLevel::Avx2 => unsafe { avx2($($argument),*) },
                $crate::cpu::isa::VectorLevel::Baseline => body($($argument),*),
            }
        }
    };
}
pub(crate) use per_vector_level;

/// Every vector level this CPU can run, the baseline included (for tests of each).
#[cfg(test)]
pub(crate) fn levels_here() -> Vec<VectorLevel> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let mut levels = vec![VectorLevel::Baseline];
        if has!("avx2") && has!("fma") {
            levels.push(VectorLevel::Avx2);
        }
        if has!("avx512f") && has!("avx512vl") && has!("fma") {
            levels.push(VectorLevel::Avx512);
        }
        levels
    }
    #[cfg(not(target_arch = "x86_64"))]
    vec![VectorLevel::Baseline]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_variable_caps_the_family_and_refuses_typos() {
        assert_eq!(parse_family(None), Ok(Family::Amx));
        assert_eq!(parse_family(Some("avx512")), Ok(Family::Avx512));
        assert_eq!(parse_family(Some("avx2")), Ok(Family::Avx2));
        assert_eq!(parse_family(Some(" portable ")), Ok(Family::Portable));
        assert_eq!(parse_family(Some("neon")), Ok(Family::Neon));
        let error = parse_family(Some("avx-2")).unwrap_err();
        assert!(error.contains("HOOKSCOPE_CPU_KERNELS=avx-2"), "{error}");
        assert!(Family::Portable < Family::Neon && Family::Neon < Family::Avx2);
        assert!(Family::Avx2 < Family::Avx512 && Family::Avx512 < Family::Amx);
    }
}
