//! The precision weights are stored in once loaded, and the precision activations meet them in
//! (`checkpoint::auto_dtype` picks the stored precision for `--dtype auto`).
//!
//! Storage precision is a memory and bandwidth choice only: every product accumulates in f32
//! and every site is served in f32. Storing in bf16 or f16 rounds each weight once, at load
//! (to nearest, ties to even), so a model loaded in bf16 computes exactly what an f32 model
//! computes on the bf16-rounded weights.

use std::fmt;
use std::str::FromStr;

/// How weights are stored once loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WeightDtype {
    /// 32-bit floats.
    #[default]
    F32,
    /// bfloat16: f32's range, 8 bits of mantissa.
    Bf16,
    /// IEEE half precision: 11 bits of mantissa, magnitudes up to 65504.
    F16,
}

impl WeightDtype {
    /// Bytes per stored weight.
    pub fn size(self) -> usize {
        match self {
            WeightDtype::F32 => 4,
            WeightDtype::Bf16 | WeightDtype::F16 => 2,
        }
    }

    /// `value` rounded to this precision (to nearest, ties to even), back in f32. A value beyond
    /// f16's range becomes infinite in f16, which the loader reports.
    pub fn round(self, value: f32) -> f32 {
        match self {
            WeightDtype::F32 => value,
            WeightDtype::Bf16 => half::bf16::from_f32(value).to_f32(),
            WeightDtype::F16 => half::f16::from_f32(value).to_f32(),
        }
    }
}

impl fmt::Display for WeightDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WeightDtype::F32 => "f32",
            WeightDtype::Bf16 => "bf16",
            WeightDtype::F16 => "f16",
        })
    }
}

impl FromStr for WeightDtype {
    type Err = String;

    /// `f32`/`float32`/`float`, `bf16`/`bfloat16`, `f16`/`float16`/`half`, with or without a
    /// `torch.` prefix.
    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim().trim_start_matches("torch.") {
            "f32" | "float32" | "float" => Ok(WeightDtype::F32),
            "bf16" | "bfloat16" => Ok(WeightDtype::Bf16),
            "f16" | "float16" | "half" => Ok(WeightDtype::F16),
            other => Err(format!(
                "`{other}` is not a weight dtype (auto, f32, bf16 or f16)"
            )),
        }
    }
}

/// How matrix products meet the stored weights.
///
/// `F32` (the default) multiplies the f32 activations by each stored weight widened to f32:
/// exact products, f32 sums, so a bf16 load computes what an f32 model computes on the rounded
/// weights. `Bf16` rounds the activations entering a matrix product to bf16 (to nearest, ties
/// to even) as well, so that two bf16 values meet in each product (exact in f32) and sums stay
/// in f32: what torch's `set_float32_matmul_precision("medium")` allows, and about three times
/// the speed of prompt calls on CPUs with AMX tiles (`tdpbf16ps`), up to twice with AVX-512 BF16
/// (`vdpbf16ps`). It applies to weights stored
/// in bf16 only, on the CPU backend; every other part of the computation (norms, attention
/// scores, activations, the recurrent scans) stays in f32.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum MatmulPrecision {
    /// Activations in f32.
    #[default]
    F32,
    /// Activations rounded to bf16 on their way into each product with a bf16 weight.
    Bf16,
}

impl fmt::Display for MatmulPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MatmulPrecision::F32 => "f32",
            MatmulPrecision::Bf16 => "bf16",
        })
    }
}

impl FromStr for MatmulPrecision {
    type Err = String;

    /// `f32`/`float32`/`highest`, `bf16`/`bfloat16`/`medium` (torch's names for the same
    /// choice).
    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "f32" | "float32" | "highest" => Ok(MatmulPrecision::F32),
            "bf16" | "bfloat16" | "medium" => Ok(MatmulPrecision::Bf16),
            other => Err(format!("`{other}` is not a matmul precision (f32 or bf16)")),
        }
    }
}

/// A `--dtype` choice: `auto` (`None`) or one precision.
pub fn parse_dtype_choice(text: &str) -> Result<Option<WeightDtype>, String> {
    match text.trim() {
        "auto" => Ok(None),
        other => other.parse().map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse_and_bad_ones_are_named() {
        assert_eq!(parse_dtype_choice("auto"), Ok(None));
        assert_eq!(parse_dtype_choice("bfloat16"), Ok(Some(WeightDtype::Bf16)));
        assert_eq!(
            parse_dtype_choice("torch.float16"),
            Ok(Some(WeightDtype::F16))
        );
        assert_eq!(parse_dtype_choice("f32"), Ok(Some(WeightDtype::F32)));
        let error = parse_dtype_choice("int8").unwrap_err();
        assert!(error.contains("`int8`"), "{error}");
    }

    #[test]
    fn rounding_is_to_nearest_and_f16_overflows_to_infinity() {
        assert_eq!(WeightDtype::Bf16.round(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(
            WeightDtype::Bf16.round(1.0 + 3.0 / 256.0),
            1.0 + 4.0 / 256.0
        );
        assert_eq!(
            WeightDtype::F16.round(0.1),
            half::f16::from_f32(0.1).to_f32()
        );
        assert!(WeightDtype::F16.round(1e6).is_infinite());
        assert_eq!(WeightDtype::F32.round(0.1), 0.1);
    }
}
