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
    /// The scaling: `default`, `linear`, `dynamic`, `llama3`, `yarn`, `longrope`.
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
    /// The pretraining context (Llama 3, YaRN, LongRoPE).
    #[serde(default)]
    pub original_max_position_embeddings: Option<f64>,
    /// YaRN's and LongRoPE's factor on cos and sin (derived from `factor` when absent).
    #[serde(default)]
    pub attention_factor: Option<f64>,
    /// YaRN: rotations in the pretraining context above which a frequency is kept.
    #[serde(default)]
    pub beta_fast: Option<f64>,
    /// YaRN: rotations below which a frequency is interpolated.
    #[serde(default)]
    pub beta_slow: Option<f64>,
    /// YaRN: the numerator's scale of the derived attention factor (with `mscale_all_dim`).
    #[serde(default)]
    pub mscale: Option<f64>,
    /// YaRN: the denominator's scale of the derived attention factor.
    #[serde(default)]
    pub mscale_all_dim: Option<f64>,
    /// YaRN: whether the ramp's ends are rounded to whole dimensions (default true).
    #[serde(default)]
    pub truncate: Option<bool>,
    /// LongRoPE: per-frequency factors within the pretraining context.
    #[serde(default)]
    pub short_factor: Option<Vec<f64>>,
    /// LongRoPE: per-frequency factors beyond it.
    #[serde(default)]
    pub long_factor: Option<Vec<f64>>,
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
    /// `llama3`, `yarn`, `longrope`); `None` when it runs `default` only.
    pub scaled: Option<usize>,
    /// A top-level `original_max_position_embeddings`, which wins over the parameters' (as
    /// transformers lets Phi-3's win); `None` where the config has none.
    pub original_max_positions: Option<usize>,
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
        let scaling = scaling(config, &params, kind, &rules)?;
        Ok(Rope {
            theta,
            scaling,
            fraction,
        })
    }

    /// The rotary embedding of heads of `head_dim`: over the rotated share of its dimensions
    /// (rounded down). Refuses LongRoPE factors that are not one per rotated pair.
    pub fn rotary(&self, config: &ArchConfig, head_dim: usize) -> Result<Rotary> {
        let dims = (head_dim as f64 * self.fraction) as usize;
        if let RopeScaling::LongRope {
            short_factor,
            long_factor,
            ..
        } = &self.scaling
        {
            for (key, factors) in [("short_factor", short_factor), ("long_factor", long_factor)] {
                if factors.len() != dims / 2 {
                    return Err(config.unsupported(format!(
                        "`rope_parameters`'s {key} field must have length {}, got {}",
                        dims / 2,
                        factors.len()
                    )));
                }
            }
        }
        Ok(Rotary::new(dims, self.theta, self.scaling.clone()))
    }
}

/// YaRN's default attention factor: `0.1 · mscale · ln(factor) + 1` (1 for factors up to 1).
fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

/// The scaling of type `kind`, if the adapter runs it (see [`RopeRules::scaled`]).
fn scaling(
    config: &ArchConfig,
    params: &RopeParameters,
    kind: &str,
    rules: &RopeRules,
) -> Result<RopeScaling> {
    let require = |value: Option<f64>, key: &str| {
        value.ok_or_else(|| config.unsupported(format!("rope type `{kind}` needs `{key}`")))
    };
    let factor = || require(params.factor, "factor");
    let Some(max_positions) = rules.scaled else {
        return match kind {
            "default" => Ok(RopeScaling::Default),
            other => Err(config.unsupported(format!("rope type `{other}` (supported: default)"))),
        };
    };
    // The pretraining context of the scalings that extend one: the top-level key, else the
    // parameters', else `max_position_embeddings` (transformers' `standardize_rope_params`).
    let original = rules
        .original_max_positions
        .map(|n| n as f64)
        .or(params.original_max_position_embeddings)
        .unwrap_or(max_positions as f64);
    if !(original >= 1.0 && original.is_finite()) {
        return Err(config.unsupported(format!(
            "`rope_parameters`'s original_max_position_embeddings must be a positive integer, \
             got {original}"
        )));
    }
    // YaRN and LongRoPE without a factor take the context's growth.
    let extension = || params.factor.unwrap_or(max_positions as f64 / original);
    Ok(match kind {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "dynamic" => RopeScaling::Dynamic {
            factor: factor()?,
            max_positions,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: require(params.low_freq_factor, "low_freq_factor")?,
            high_freq_factor: require(params.high_freq_factor, "high_freq_factor")?,
            original_max_positions: original,
        },
        "yarn" => {
            let factor = extension();
            let attention_factor = match (
                params.attention_factor,
                params.mscale,
                params.mscale_all_dim,
            ) {
                (Some(given), ..) => given,
                (None, Some(mscale), Some(all)) if mscale != 0.0 && all != 0.0 => {
                    yarn_mscale(factor, mscale) / yarn_mscale(factor, all)
                }
                _ => yarn_mscale(factor, 1.0),
            };
            // `beta_fast or 32`: a zero is the default too.
            let beta = |value: Option<f64>, default| value.filter(|b| *b != 0.0).unwrap_or(default);
            let (beta_fast, beta_slow) =
                (beta(params.beta_fast, 32.0), beta(params.beta_slow, 1.0));
            if !(beta_fast > 0.0
                && beta_slow > 0.0
                && beta_fast.is_finite()
                && beta_slow.is_finite())
            {
                return Err(config.unsupported(format!(
                    "`rope_parameters`'s beta_fast and beta_slow must be positive, got \
                     {beta_fast} and {beta_slow}"
                )));
            }
            RopeScaling::Yarn {
                factor,
                original_max_positions: original,
                beta_fast,
                beta_slow,
                truncate: params.truncate.unwrap_or(true),
                attention_factor,
            }
        }
        "longrope" => {
            let factors = |value: &Option<Vec<f64>>, key: &str| {
                value.clone().ok_or_else(|| {
                    config.unsupported(format!("rope type `longrope` needs `{key}`"))
                })
            };
            let (short_factor, long_factor) = (
                factors(&params.short_factor, "short_factor")?,
                factors(&params.long_factor, "long_factor")?,
            );
            if let Some(bad) = short_factor
                .iter()
                .chain(&long_factor)
                .find(|f| !(**f > 0.0 && f.is_finite()))
            {
                return Err(config.unsupported(format!(
                    "`rope_parameters`'s short_factor and long_factor must hold positive \
                     numbers, got {bad}"
                )));
            }
            let factor = extension();
            let attention_factor = params.attention_factor.unwrap_or(match factor <= 1.0 {
                true => 1.0,
                false => (1.0 + factor.ln() / original.ln()).sqrt(),
            });
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_positions: original as usize,
                attention_factor,
            }
        }
        other => {
            return Err(config.unsupported(format!(
                "rope type `{other}` (supported: default, linear, dynamic, llama3, yarn, \
                 longrope)"
            )));
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
        original_max_positions: None,
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
        assert_eq!(
            rope.rotary(&config(), 8).unwrap(),
            Rotary::new(6, 7.0, RopeScaling::Default)
        );
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
            original_max_positions: None,
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

    #[test]
    fn yarn_and_longrope_derive_their_attention_factors_as_transformers_does() {
        let rules = RopeRules {
            scaled: Some(64),
            original_max_positions: None,
            theta: None,
            fraction: RotaryFraction::Full,
        };
        let yarn = |params| match parse(params, rules).unwrap().scaling {
            RopeScaling::Yarn {
                factor,
                attention_factor,
                beta_fast,
                ..
            } => (factor, attention_factor, beta_fast),
            other => panic!("{other:?}"),
        };
        let (factor, attention, beta_fast) = yarn(json!({"rope_type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 16}));
        assert_eq!((factor, beta_fast), (4.0, 32.0));
        assert!((attention - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
        // With both mscales, their ratio; without a factor, the context's growth (64 / 16).
        let (factor, attention, _) = yarn(json!({"rope_type": "yarn", "mscale": 1.0,
            "mscale_all_dim": 0.5, "original_max_position_embeddings": 16}));
        assert_eq!(factor, 4.0);
        let expected = (0.1 * 4f64.ln() + 1.0) / (0.05 * 4f64.ln() + 1.0);
        assert!((attention - expected).abs() < 1e-12);

        // LongRoPE: the top-level pretraining context wins (Phi-3's), and sets the factor.
        let rules = RopeRules {
            original_max_positions: Some(8),
            ..rules
        };
        let params = json!({"rope_type": "longrope", "short_factor": [1.0, 1.5],
            "long_factor": [2.0, 3.0], "original_max_position_embeddings": 32});
        let rope = parse(params, rules).unwrap();
        let RopeScaling::LongRope {
            original_max_positions,
            attention_factor,
            ..
        } = rope.scaling
        else {
            panic!("{:?}", rope.scaling)
        };
        assert_eq!(original_max_positions, 8);
        let expected = (1.0 + 8f64.ln() / 8f64.ln()).sqrt();
        assert!((attention_factor - expected).abs() < 1e-12);
        let error = parse(
            json!({"rope_type": "longrope", "short_factor": [1.0]}),
            rules,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("needs `long_factor`"), "{error}");
    }
}
