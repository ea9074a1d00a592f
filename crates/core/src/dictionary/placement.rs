//! Where a dictionary attaches on a model, checked against the model's sites and sizes.

use super::hook_names::{HookSite, site_of_hook};
use super::{AttachOptions, Dictionary};
use crate::adapter::{CausalLm, PlainNorm};
use crate::error::{Error, Result};
use crate::schema::{DictionaryPlacement, Dim, LayerSite, ModelLayout, Residual, Site};

/// Where a dictionary attaches, and the norm it applies to its input first, if its input is a
/// normalised value the model never holds (`ln2.hook_normalized`).
pub(crate) struct Placed {
    /// The sites it reads and writes.
    pub placement: DictionaryPlacement,
    /// The norm of the input site's value the dictionary encodes, without gain and bias.
    pub input_norm: Option<PlainNorm>,
}

/// The placement of `dictionary` on `network` (its layout, and its feed-forward norms where a
/// hook needs them: [`CausalLm::feed_forward_norms`]) as `options` ask, or an error naming
/// the site and sizes at fault.
pub(crate) fn place(
    layout: &ModelLayout,
    network: &dyn CausalLm,
    dictionary: &Dictionary,
    options: &AttachOptions,
) -> Result<Placed> {
    let config = dictionary.config();
    let error = |message: String| Error::Dictionary {
        path: config.path.clone(),
        message,
    };
    let named = |given: &Option<String>, stored: &Option<String>, what: &str| {
        let name = given.as_ref().or(stored.as_ref()).ok_or_else(|| {
            error(format!(
                "its config names no {what}; name one (`--sae SITE=PATH`, AttachOptions::site)"
            ))
        })?;
        let site = site_of_hook(name).map_err(|message| error(message.clone()))?;
        served(layout, network, name, site).map_err(error)
    };
    let (site, (input, input_norm)) = match config.transcoder {
        true => {
            let (site, norm) = named(
                &options.site,
                &config.hook_out,
                "output site (`hook_name_out`)",
            )?;
            if norm.is_some() {
                return Err(error(
                    "its output is a normalised value the model never holds; a dictionary \
                     writes a site the model serves"
                        .into(),
                ));
            }
            let input = named(&options.input, &config.hook, "input site (`hook_name`)")?;
            (site, input)
        }
        false => {
            if options.input.is_some() {
                return Err(error(
                    "an input site is for transcoders; a sparse autoencoder reads the site it is \
                     attached to"
                        .into(),
                ));
            }
            let (site, norm) = named(&options.site, &config.hook, "site (`hook_name`)")?;
            if norm.is_some() {
                return Err(error(
                    "a sparse autoencoder on `ln2.hook_normalized` would write back a value the \
                     model never holds; only a transcoder can read it"
                        .into(),
                ));
            }
            (site, (site, None))
        }
    };
    if !matches!(site, Site::Layer { .. }) {
        return Err(error(format!(
            "`{site}` is not a layer site; dictionaries attach to a block's sites"
        )));
    }
    let order = layout.call_order();
    let position = |s: Site| order.iter().position(|o| *o == s);
    if config.transcoder && position(input) >= position(site) {
        return Err(error(format!(
            "its input `{input}` does not come before its output `{site}` in a call"
        )));
    }
    let head = config.head;
    let d_in = width(layout, input, head, &error)?;
    let d_out = width(layout, site, head, &error)?;
    if d_in != config.d_in {
        return Err(error(format!(
            "`d_in` is {} but `{input}`{} is {d_in} wide",
            config.d_in,
            head.map_or(String::new(), |h| format!(" head {h}"))
        )));
    }
    if d_out != config.d_out {
        return Err(error(format!(
            "`d_out` is {} but `{site}` is {d_out} wide",
            config.d_out
        )));
    }
    Ok(Placed {
        placement: DictionaryPlacement {
            site,
            input,
            features: config.features,
            head,
        },
        input_norm,
    })
}

/// The served site a hook name stands for on this model, with the norm to apply to its value
/// where the hook is a normalised value the model does not hold.
fn served(
    layout: &ModelLayout,
    network: &dyn CausalLm,
    name: &str,
    hook: HookSite,
) -> std::result::Result<(Site, Option<PlainNorm>), String> {
    let declared = |layer: usize| {
        network.feed_forward_norms(layer).ok_or_else(|| {
            format!(
                "`{name}` needs to know layer {layer}'s feed-forward norms, which this model's \
                 adapter does not declare (or the layer has no feed-forward part)"
            )
        })
    };
    let (site, norm) = match hook {
        HookSite::Served(site) => (site, None),
        HookSite::MlpOwnOutput { layer } => {
            if declared(layer)?.output_norm {
                return Err(format!(
                    "`{name}` is the MLP's output before the norm that follows it in this \
                     model, a value hookscope does not serve (`layers.{layer}.mlp_output` is \
                     after that norm: TransformerLens' `hook_mlp_out`)"
                ));
            }
            (Site::layer(layer, LayerSite::MlpOutput), None)
        }
        HookSite::NormalizedMlpInput { layer } => {
            let norm = declared(layer)?.input.ok_or_else(|| {
                format!("`{name}`: layer {layer}'s feed-forward part reads through no norm")
            })?;
            let read = match layout.layers.get(layer).map(|spec| spec.residual) {
                Some(Residual::Parallel) => LayerSite::LayerInput,
                _ => LayerSite::ResidualMid,
            };
            (Site::layer(layer, read), Some(norm))
        }
    };
    layout
        .resolve(&site.to_string())
        .map_err(|e| format!("`{name}`: {e}"))?;
    Ok((site, norm))
}

/// The width a dictionary reads at `site`: its last axis for `[B, T, X]`, the heads' together
/// (`NH * D`) for `[B, T, NH, D]`, or one head's (`D`) where `head` is given.
fn width(
    layout: &ModelLayout,
    site: Site,
    head: Option<usize>,
    error: &dyn Fn(String) -> Error,
) -> Result<usize> {
    let symbols = layout.symbolic_shape(site)?;
    let fixed = layout.fixed_shape(site)?;
    let per_token = matches!(symbols.0, [Dim::B, Dim::T, ..]);
    let sizes: Option<Vec<usize>> = fixed.iter().skip(2).copied().collect();
    match (per_token, sizes.as_deref(), head) {
        (true, Some(&[width]), None) => Ok(width),
        (true, Some(&[heads, dim]), None) => heads
            .checked_mul(dim)
            .ok_or_else(|| error(format!("`{site}` is too wide"))),
        (true, Some(&[heads, dim]), Some(head)) if head < heads => Ok(dim),
        (true, Some(&[heads, _]), Some(head)) => Err(error(format!(
            "`hook_head_index` is {head} but `{site}` has {heads} heads"
        ))),
        (true, Some(&[_]), Some(head)) => Err(error(format!(
            "`hook_head_index` is {head} but `{site}` {symbols} has no head axis"
        ))),
        _ => Err(error(format!(
            "`{site}` is shaped {symbols}; dictionaries read sites shaped [B, T, X] or \
             [B, T, heads, X]"
        ))),
    }
}
