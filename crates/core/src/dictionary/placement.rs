//! Where a dictionary attaches on a model, checked against the model's sites and sizes.

use super::{AttachOptions, Dictionary, site_of_hook};
use crate::error::{Error, Result};
use crate::schema::{DictionaryPlacement, Dim, ModelLayout, Site};

/// The placement of `dictionary` on a model of `layout` as `options` ask, or an error naming
/// the site and sizes at fault.
pub(crate) fn place(
    layout: &ModelLayout,
    dictionary: &Dictionary,
    options: &AttachOptions,
) -> Result<DictionaryPlacement> {
    let config = dictionary.config();
    let error = |message: String| Error::Dictionary {
        path: config.path.clone(),
        message,
    };
    let named = |given: &Option<String>, stored: &Option<String>, what: &str| -> Result<Site> {
        let name = given.as_ref().or(stored.as_ref()).ok_or_else(|| {
            error(format!(
                "its config names no {what}; name one (`--sae SITE=PATH`, AttachOptions::site)"
            ))
        })?;
        let site = site_of_hook(name).map_err(|message| error(message.clone()))?;
        layout.resolve(&site.to_string())?;
        Ok(site)
    };
    let (site, input) = match config.transcoder {
        true => {
            let site = named(
                &options.site,
                &config.hook_out,
                "output site (`hook_name_out`)",
            )?;
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
            let site = named(&options.site, &config.hook, "site (`hook_name`)")?;
            (site, site)
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
    Ok(DictionaryPlacement {
        site,
        input,
        features: config.features,
        head,
    })
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
