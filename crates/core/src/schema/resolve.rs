//! Turning user-written names and glob patterns into the sites of one model, with helpful errors.

use std::fmt;

use super::layout::{LayerSpec, ModelLayout};
use super::site::Site;
use crate::error::{Error, Result};

impl ModelLayout {
    /// Resolves one exact site name against this model.
    ///
    /// Errors say what is wrong: an unknown name suggests the closest valid one, a layer past the
    /// end says how many layers there are, and a schema site this layer lacks lists what it has.
    pub fn resolve(&self, name: &str) -> Result<Site> {
        let Some(site) = Site::parse(name) else {
            return Err(Error::UnknownSite {
                name: name.to_string(),
                suggestion: self.closest_site(name),
            });
        };
        if let Site::Layer { layer, site: local }
        | Site::Dictionary {
            layer, site: local, ..
        } = site
        {
            let spec = self.block(layer, &name)?;
            if !spec.has(local) {
                return Err(not_in_architecture(spec, layer, &name));
            }
        }
        if let Site::Dictionary { .. } = site
            && self.dictionary_at(site.dictionary_host()).is_none()
        {
            return Err(no_dictionary(site));
        }
        Ok(site)
    }

    /// Block `layer`, or the error saying this model has no such layer, naming the site asked
    /// for as `name`.
    pub(super) fn block(&self, layer: usize, name: &dyn fmt::Display) -> Result<&LayerSpec> {
        self.layers
            .get(layer)
            .ok_or_else(|| Error::LayerOutOfRange {
                name: name.to_string(),
                layer,
                layers: self.layers.len(),
            })
    }

    /// Expands a pattern (`*` matches any run of characters, `?` one) against this model's
    /// sites, in call order. A pattern without wildcards must name one valid site.
    pub fn expand(&self, pattern: &str) -> Result<Vec<Site>> {
        if !pattern.contains(['*', '?']) {
            return self.resolve(pattern).map(|site| vec![site]);
        }
        // `mixer` is an alias of `self_attn` in patterns too (canonical names say `self_attn`).
        let canonical = pattern.replace(".mixer.", ".self_attn.");
        let matcher = wildmatch::WildMatch::new(&canonical);
        let sites: Vec<Site> = self
            .call_order()
            .into_iter()
            .filter(|site| matcher.matches(&site.to_string()))
            .collect();
        if sites.is_empty() {
            return Err(Error::PatternMatchesNothing(pattern.to_string()));
        }
        Ok(sites)
    }

    fn closest_site(&self, name: &str) -> Option<String> {
        // A site whose last part is spelled right but sits under another path
        // (`layers.1.self_attn.attention_output` for `layers.1.attention_output`) is the likely
        // meaning; otherwise the nearest name by edit distance, so that
        // `layers.3.atention_keys` suggests layer 3's keys.
        let candidates: Vec<String> = self.call_order().iter().map(ToString::to_string).collect();
        let last_part = |site: &str| site.rsplit('.').next().unwrap_or("").to_string();
        let same_last_part = candidates
            .iter()
            .filter(|candidate| last_part(candidate) == last_part(name))
            .min_by_key(|candidate| strsim::levenshtein(name, candidate));
        if let Some(candidate) = same_last_part {
            return Some(candidate.clone());
        }
        candidates
            .into_iter()
            .map(|candidate| (strsim::levenshtein(name, &candidate), candidate))
            .filter(|(distance, candidate)| *distance <= candidate.len().max(name.len()) / 3)
            .min_by_key(|(distance, _)| *distance)
            .map(|(_, candidate)| candidate)
    }
}

/// The error for a dictionary value at a site no dictionary is attached to.
pub(super) fn no_dictionary(site: Site) -> Error {
    Error::NoDictionary {
        name: site.to_string(),
        site: site.dictionary_host().to_string(),
    }
}

/// The error for a schema site that block `layer` (declared as `spec`) does not have.
pub(super) fn not_in_architecture(
    spec: &LayerSpec,
    layer: usize,
    name: &dyn fmt::Display,
) -> Error {
    let available: Vec<String> = spec.sites().map(|s| s.name()).collect();
    Error::SiteNotInArchitecture {
        name: name.to_string(),
        layer,
        mixer: spec.mixer.describe(),
        available: available.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::super::layout::tests::gpt2_like;
    use super::*;

    #[test]
    fn the_mixer_alias_works_in_patterns_too() {
        let layout = gpt2_like(2);
        let aliased = layout.expand("layers.0.mixer.*").unwrap();
        assert_eq!(aliased, layout.expand("layers.0.self_attn.*").unwrap());
        assert_eq!(aliased.len(), 7);
    }

    #[test]
    fn unknown_name_suggests_the_closest_site() {
        let err = gpt2_like(12)
            .resolve("layers.3.self_attn.atention_keys")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown site `layers.3.self_attn.atention_keys`; did you mean `layers.3.self_attn.attention_keys`?"
        );
        let err = gpt2_like(2)
            .resolve("layers.1.self_attn.attention_output")
            .unwrap_err();
        assert!(
            err.to_string()
                .ends_with("did you mean `layers.1.attention_output`?"),
            "{err}"
        );
        let err = gpt2_like(2).resolve("completely_wrong_thing").unwrap_err();
        assert!(matches!(
            err,
            Error::UnknownSite {
                suggestion: None,
                ..
            }
        ));
    }

    #[test]
    fn layer_out_of_range_says_how_many_layers() {
        let err = gpt2_like(12).resolve("layers.99.layer_output").unwrap_err();
        assert_eq!(
            err.to_string(),
            "`layers.99.layer_output`: layer 99 is out of range; this model has 12 layers (0..=11)"
        );
    }

    #[test]
    fn site_of_another_architecture_is_named_as_such() {
        let err = gpt2_like(2)
            .resolve("layers.1.self_attn.state_output")
            .unwrap_err();
        let message = err.to_string();
        assert!(message.contains("softmax attention"), "{message}");
        assert!(message.contains("self_attn.attention_keys"), "{message}");
    }

    #[test]
    fn globs_expand_in_call_order() {
        let layout = gpt2_like(3);
        let sites = layout.expand("layers.*.layer_output").unwrap();
        let names: Vec<String> = sites.iter().map(ToString::to_string).collect();
        assert_eq!(
            names,
            [
                "layers.0.layer_output",
                "layers.1.layer_output",
                "layers.2.layer_output"
            ]
        );
        assert_eq!(layout.expand("*").unwrap(), layout.call_order());
        assert!(matches!(
            layout.expand("layers.*.state_output"),
            Err(Error::PatternMatchesNothing(_))
        ));
    }
}
