//! The sites dictionaries name in their configs: TransformerLens hook names (what SAELens and
//! circuit-tracer write) and hookscope's own site names.

use crate::schema::{LayerSite, MixerNamespace, MixerSite, Site};

/// The hookscope site a dictionary's hook name stands for, or why it has none.
pub fn site_of_hook(name: &str) -> Result<Site, String> {
    if let Some(site) = Site::parse(name) {
        return Ok(site);
    }
    let unknown = || {
        format!(
            "`{name}` is neither a hookscope site nor a TransformerLens hook hookscope serves \
             (blocks.L.hook_resid_pre, hook_resid_post, hook_attn_out, hook_mlp_out, attn.hook_z)"
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
        "attn.hook_z" => {
            LayerSite::Mixer(MixerNamespace::SelfAttn, MixerSite::AttentionHeadOutputs)
        }
        "hook_resid_mid"
        | "ln2.hook_normalized"
        | "hook_mlp_in"
        | "mlp.hook_post"
        | "mlp.hook_pre"
        | "attn.hook_result" => {
            return Err(format!(
                "`{name}` names a value hookscope does not serve as a site yet (the mid-block \
                 residual, the MLP's input and neurons, and per-head writes are planned)"
            ));
        }
        _ => return Err(unknown()),
    };
    Ok(Site::layer(layer, site))
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
            ("layers.2.layer_output", "layers.2.layer_output"),
        ] {
            assert_eq!(site_of_hook(hook).unwrap().to_string(), site, "{hook}");
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
        assert!(
            site_of_hook("blocks.1.hook_resid_mid")
                .unwrap_err()
                .contains("not serve")
        );
    }
}
