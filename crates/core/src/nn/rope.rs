//! The rotary-position fields of a `config.json`, read once for every adapter:
//! `rope_parameters` (transformers 5.x) or `rope_scaling` (older), with the top-level base and
//! rotated share they may stand in for, checked as transformers' rope validation checks them.

use serde::Deserialize;

use super::{RopeScaling, Rotary};
use crate::config::ArchConfig;
use crate::error::Result;

/// The base used when a config names none.
const DEFAULT_THETA: f64 = 10_000.0;

/// A `rope_parameters` (or `rope_scaling`) object. Fields a scaling does not use are ignored.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct RopeParameters {
    /// The scaling: `default`, `linear`, `dynamic`, `llama3`.
    #[serde(default)]
    pub rope_type: Option<String>,
    /// The scaling's older key (`rope_scaling.type`), read when `rope_type` is absent.
    #[serde(default, rename = "type")]
    pub legacy_type: Option<String>,
    /// The base.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// The scaling factor.
    #[serde(default)]
    pub factor: Option<f64>,
    /// Llama 3's low-frequency factor.
    #[serde(default)]
    pub low_freq_factor: Option<f64>,
    /// Llama 3's high-frequency factor.
    #[serde(default)]
    pub high_freq_factor: Option<f64>,
    /// Llama 3's pretraining context.
    #[serde(default)]
    pub original_max_position_embeddings: Option<f64>,
    /// The rotated share of each head.
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
}

/// How much of each head an adapter rotates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RotaryFraction {
    /// All of it; a config asking for a partial rotary is refused (Llama).
    Full,
    /// A share the architecture fixes, whatever the config says (Bamba: 0.5).
    Fixed(f64),
    /// `partial_rotary_factor` from the parameters, else the top-level `legacy` key
    /// (`partial_rotary_factor`, GPT-NeoX's `rotary_pct`), else `default`.
    Configured {
        /// The top-level value, if the config has one.
        legacy: Option<f64>,
        /// The architecture's default.
        default: f64,
    },
}

/// What of the rotary config an adapter runs, and the top-level values that stand in for
/// missing parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeRules {
    /// `max_position_embeddings` when the adapter runs the scaled types (`linear`, `dynamic`,
    /// `llama3`); `None` when it runs `default` only.
    pub scaled: Option<usize>,
    /// The top-level base (`rope_theta`, GPT-NeoX's `rotary_emb_base`), if any.
    pub theta: Option<f64>,
    /// The rotated share of each head.
    pub fraction: RotaryFraction,
}

/// The rotary embedding a config declares.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    /// The base.
    pub theta: f64,
    /// The scaling.
    pub scaling: RopeScaling,
    /// The rotated share of each head.
    pub fraction: f64,
}

impl Rope {
    /// Reads `params` (the config's `rope_parameters`, or its `rope_scaling`) under `rules`,
    /// refusing what transformers' validation refuses (in its words) and what the adapter does
    /// not run.
    pub fn parse(
        config: &ArchConfig,
        params: Option<&RopeParameters>,
        rules: RopeRules,
    ) -> Result<Rope> {
        let params = params.cloned().unwrap_or_default();
        let theta = params.rope_theta.or(rules.theta).unwrap_or(DEFAULT_THETA);
        let kind = params
            .rope_type
            .as_deref()
            .or(params.legacy_type.as_deref())
            .unwrap_or("default");
        if let Some(factor) = params.factor.filter(|f| f.is_nan() || *f < 1.0) {
            return Err(config.unsupported(format!(
                "`rope_parameters`'s factor field must be a float >= 1, got {factor}"
            )));
        }
        if !(theta > 0.0 && theta.is_finite()) {
            return Err(config.unsupported(format!("rope_theta must be positive, got {theta}")));
        }
        if let (Some(low), Some(high)) = (params.low_freq_factor, params.high_freq_factor)
            && high <= low
        {
            return Err(config.unsupported(format!(
                "`rope_parameters`'s high_freq_factor field must be greater than \
                 low_freq_factor, got high_freq_factor={high} and low_freq_factor={low}"
            )));
        }
        let fraction = match rules.fraction {
            RotaryFraction::Full => match params.partial_rotary_factor {
                Some(f) if f != 1.0 => {
                    return Err(config.unsupported("partial_rotary_factor != 1"));
                }
                _ => 1.0,
            },
            RotaryFraction::Fixed(fraction) => fraction,
            RotaryFraction::Configured { legacy, default } => {
                params.partial_rotary_factor.or(legacy).unwrap_or(default)
            }
        };
        let scaling = scaling(config, &params, kind, rules.scaled)?;
        Ok(Rope {
            theta,
            scaling,
            fraction,
        })
    }

    /// The rotary embedding of heads of `head_dim`: over the rotated share of its dimensions
    /// (rounded down).
    pub fn rotary(&self, head_dim: usize) -> Rotary {
        let dims = (head_dim as f64 * self.fraction) as usize;
        Rotary::new(dims, self.theta, self.scaling.clone())
    }
}

/// The scaling of type `kind`, if the adapter runs it (`scaled`: see [`RopeRules::scaled`]).
fn scaling(
    config: &ArchConfig,
    params: &RopeParameters,
    kind: &str,
    scaled: Option<usize>,
) -> Result<RopeScaling> {
    let require = |value: Option<f64>, key: &str| {
        value.ok_or_else(|| config.unsupported(format!("rope type `{kind}` needs `{key}`")))
    };
    let factor = || require(params.factor, "factor");
    Ok(match (kind, scaled) {
        ("default", _) => RopeScaling::Default,
        ("linear", Some(_)) => RopeScaling::Linear { factor: factor()? },
        ("dynamic", Some(max_positions)) => RopeScaling::Dynamic {
            factor: factor()?,
            max_positions,
        },
        ("llama3", Some(_)) => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: require(params.low_freq_factor, "low_freq_factor")?,
            high_freq_factor: require(params.high_freq_factor, "high_freq_factor")?,
            original_max_positions: require(
                params.original_max_position_embeddings,
                "original_max_position_embeddings",
            )?,
        },
        (other, Some(_)) => {
            return Err(config.unsupported(format!(
                "rope type `{other}` (supported: default, linear, dynamic, llama3)"
            )));
        }
        (other, None) => {
            return Err(config.unsupported(format!("rope type `{other}` (supported: default)")));
        }
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn config() -> ArchConfig {
        ArchConfig {
            path: "config.json".into(),
            json: json!({}),
        }
    }

    fn parse(params: serde_json::Value, rules: RopeRules) -> Result<Rope> {
        let params: RopeParameters = serde_json::from_value(params).unwrap();
        Rope::parse(&config(), Some(&params), rules)
    }

    const DEFAULT_ONLY: RopeRules = RopeRules {
        scaled: None,
        theta: Some(500.0),
        fraction: RotaryFraction::Configured {
            legacy: Some(0.5),
            default: 0.25,
        },
    };

    #[test]
    fn parameters_override_the_top_level_values() {
        let rope = parse(json!({}), DEFAULT_ONLY).unwrap();
        assert_eq!((rope.theta, rope.fraction), (500.0, 0.5));
        let rope = parse(
            json!({"rope_theta": 7.0, "partial_rotary_factor": 0.75}),
            DEFAULT_ONLY,
        )
        .unwrap();
        assert_eq!((rope.theta, rope.fraction), (7.0, 0.75));
        assert_eq!(rope.rotary(8), Rotary::new(6, 7.0, RopeScaling::Default));
    }

    #[test]
    fn scalings_run_only_where_the_adapter_supports_them() {
        let linear = json!({"type": "linear", "factor": 2.0});
        let error = parse(linear.clone(), DEFAULT_ONLY).unwrap_err().to_string();
        assert!(
            error.contains("rope type `linear` (supported: default)"),
            "{error}"
        );
        let scaled = RopeRules {
            scaled: Some(64),
            theta: None,
            fraction: RotaryFraction::Full,
        };
        let rope = parse(linear, scaled).unwrap();
        assert_eq!(rope.scaling, RopeScaling::Linear { factor: 2.0 });
        let error = parse(json!({"rope_type": "llama3", "factor": 8.0}), scaled)
            .unwrap_err()
            .to_string();
        assert!(error.contains("needs `low_freq_factor`"), "{error}");
        let error = parse(json!({"partial_rotary_factor": 0.5}), scaled)
            .unwrap_err()
            .to_string();
        assert!(error.contains("partial_rotary_factor != 1"), "{error}");
    }
}
