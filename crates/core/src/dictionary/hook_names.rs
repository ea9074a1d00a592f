//! The sites dictionaries name in their configs: TransformerLens hook names (what SAELens and
//! circuit-tracer write) and hookscope's own site names.

use crate::schema::{LayerSite, MixerNamespace, MixerSite, MlpSite, Site};

/// What a dictionary's hook name stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookSite {
    /// A site hookscope serves.
    Served(Site),
    /// TransformerLens' `blocks.L.ln2.hook_normalized`: what layer `L`'s feed-forward part
    /// reads, normalised but before its norm's gain and bias (an unfolded model never holds
    /// it; a dictionary reading it normalises the norm's input itself).
    NormalizedMlpInput {
        /// The layer.
        layer: usize,
    },
    /// circuit-tracer's `blocks.L.mlp.hook_out`: the feed-forward part's own output, which is
    /// `mlp_output` wherever no norm follows the part.
    MlpOwnOutput {
        /// The layer.
        layer: usize,
    },
}

/// The hookscope site a dictionary's hook name stands for, or why it has none.
pub fn site_of_hook(name: &str) -> Result<HookSite, String> {
    if let Some(site) = Site::parse(name) {
        return Ok(HookSite::Served(site));
    }
    let unknown = || {
        format!(
            "`{name}` is neither a hookscope site nor a TransformerLens hook hookscope serves \
             (blocks.L.hook_resid_pre, hook_resid_mid, hook_mlp_in, hook_resid_post, \
             hook_attn_out, hook_mlp_out, attn.hook_z, attn.hook_result, mlp.hook_pre, \
             mlp.hook_pre_linear, mlp.hook_post, ln2.hook_normalized, and circuit-tracer's \
             mlp.hook_in and mlp.hook_out)"
        )
    };
    let rest = name.strip_prefix("blocks.").ok_or_else(unknown)?;
    let (layer, hook) = rest.split_once('.').ok_or_else(unknown)?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        return Err(unknown());
    }
    let layer: usize = layer.parse().map_err(|_| unknown())?;
    let site = match hook {
        "hook_resid_pre" => LayerSite::LayerInput,
        "hook_resid_post" => LayerSite::LayerOutput,
        "hook_attn_out" => LayerSite::AttentionOutput,
        "hook_mlp_out" => LayerSite::MlpOutput,
        // TransformerLens' `hook_mlp_in` is the residual the MLP branch reads before `ln2`.
        "hook_resid_mid" | "hook_mlp_in" => LayerSite::ResidualMid,
        // circuit-tracer's replacement MLP's input: after `ln2`, gain included.
        "mlp.hook_in" => LayerSite::MlpInput,
        "mlp.hook_out" => return Ok(HookSite::MlpOwnOutput { layer }),
        "ln2.hook_normalized" => return Ok(HookSite::NormalizedMlpInput { layer }),
        "attn.hook_z" => {
            LayerSite::Mixer(MixerNamespace::SelfAttn, MixerSite::AttentionHeadOutputs)
        }
        "attn.hook_result" => {
            LayerSite::Mixer(MixerNamespace::SelfAttn, MixerSite::AttentionHeadWrites)
        }
        "mlp.hook_pre" => LayerSite::Mlp(MlpSite::PreActivation),
        "mlp.hook_pre_linear" => LayerSite::Mlp(MlpSite::UpProjection),
        "mlp.hook_post" => LayerSite::Mlp(MlpSite::PostActivation),
        _ => return Err(unknown()),
    };
    Ok(HookSite::Served(Site::layer(layer, site)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transformer_lens_names_map_to_sites() {
        for (hook, site) in [
            ("blocks.20.hook_resid_post", "layers.20.layer_output"),
            ("blocks.0.hook_resid_pre", "layers.0.layer_input"),
            ("blocks.3.hook_attn_out", "layers.3.attention_output"),
            ("blocks.3.hook_mlp_out", "layers.3.mlp_output"),
            (
                "blocks.5.attn.hook_z",
                "layers.5.self_attn.attention_head_outputs",
            ),
            ("blocks.4.hook_resid_mid", "layers.4.residual_mid"),
            ("blocks.4.hook_mlp_in", "layers.4.residual_mid"),
            ("blocks.4.mlp.hook_pre", "layers.4.mlp.pre_activation"),
            ("blocks.4.mlp.hook_pre_linear", "layers.4.mlp.up_projection"),
            ("blocks.4.mlp.hook_post", "layers.4.mlp.post_activation"),
            (
                "blocks.5.attn.hook_result",
                "layers.5.self_attn.attention_head_writes",
            ),
            ("blocks.4.mlp.hook_in", "layers.4.mlp_input"),
            ("layers.2.layer_output", "layers.2.layer_output"),
        ] {
            let served = match site_of_hook(hook).unwrap() {
                HookSite::Served(site) => site.to_string(),
                other => panic!("{hook}: {other:?}"),
            };
            assert_eq!(served, site, "{hook}");
        }
        for hook in [
            "blocks.x.hook_resid_post",
            "blocks.1.hook_bogus",
            "embed",
            "blocks.1",
        ] {
            assert!(
                site_of_hook(hook).unwrap_err().contains("TransformerLens"),
                "{hook}"
            );
        }
        assert_eq!(
            site_of_hook("blocks.1.ln2.hook_normalized"),
            Ok(HookSite::NormalizedMlpInput { layer: 1 })
        );
        assert_eq!(
            site_of_hook("blocks.7.mlp.hook_out"),
            Ok(HookSite::MlpOwnOutput { layer: 7 })
        );
    }
}
