//! Recording the sites a run serves, and checking them against the step-order contract.

use std::collections::BTreeMap;

use hookscope::hooks::Observer;
use hookscope::{LayerSite, Site};

/// Records every site served, per step, in order.
#[derive(Debug, Default, Clone)]
pub struct Recorder {
    /// `steps[k]`: the sites step k served, in order.
    pub steps: Vec<Vec<Site>>,
}

impl Observer for Recorder {
    fn served(&mut self, step: usize, site: Site) {
        if self.steps.len() <= step {
            self.steps.resize_with(step + 1, Vec::new);
        }
        self.steps[step].push(site);
    }
}

/// Whether a site is a mixer's interior site (which a fused kernel may compute unserved when
/// nobody observes it).
fn is_interior(site: &Site) -> bool {
    matches!(
        site,
        Site::Layer {
            site: LayerSite::Mixer(..),
            ..
        }
    )
}

/// Checks one call's served sites against the declared order: every site served once, in the
/// declared order, and none missing except interior sites that `observed` says nobody read or
/// wrote (the rule that lets a fused kernel compute them without serving them). The error names
/// the first difference.
pub fn check_call_order(
    declared: &[Site],
    served: &[Site],
    observed: impl Fn(&Site) -> bool,
) -> Result<(), String> {
    let mut counts: BTreeMap<Site, i64> = BTreeMap::new();
    for site in served {
        *counts.entry(*site).or_default() += 1;
    }
    if let Some((site, _)) = counts.iter().find(|(_, n)| **n > 1) {
        return Err(format!("`{site}` served more than once"));
    }
    let mut next = 0;
    for (position, site) in declared.iter().enumerate() {
        if served.get(next) == Some(site) {
            next += 1;
        } else if counts.contains_key(site) {
            return Err(format!(
                "position {position}: served `{}`, the declaration says `{site}`",
                served
                    .get(next)
                    .map_or("nothing".into(), ToString::to_string)
            ));
        } else if is_interior(site) && !observed(site) {
            // Unobserved interior site: a fused kernel may skip serving it.
        } else {
            return Err(format!("`{site}` declared, not served"));
        }
    }
    match served.get(next) {
        Some(extra) => Err(format!("`{extra}` served undeclared")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookscope::MixerSite;

    fn sites() -> Vec<Site> {
        vec![
            Site::InputIds,
            Site::layer(0, LayerSite::LayerInput),
            Site::self_attn(0, MixerSite::AttentionQueries),
            Site::self_attn(0, MixerSite::AttentionScores),
            Site::layer(0, LayerSite::LayerOutput),
            Site::Logits,
        ]
    }

    #[test]
    fn only_unobserved_interior_sites_may_be_skipped() {
        let declared = sites();
        assert!(check_call_order(&declared, &declared, |_| true).is_ok());
        let fused: Vec<Site> = declared
            .iter()
            .copied()
            .filter(|s| *s != Site::self_attn(0, MixerSite::AttentionScores))
            .collect();
        assert!(check_call_order(&declared, &fused, |_| false).is_ok());
        let error = check_call_order(&declared, &fused, |_| true).unwrap_err();
        assert!(
            error.contains("attention_scores` declared, not served"),
            "{error}"
        );
        let no_output: Vec<Site> = declared[..4]
            .iter()
            .copied()
            .chain([Site::Logits])
            .collect();
        let error = check_call_order(&declared, &no_output, |_| false).unwrap_err();
        assert!(
            error.contains("layer_output` declared, not served"),
            "{error}"
        );
    }

    #[test]
    fn swaps_repeats_and_extras_are_named() {
        let declared = sites();
        let mut swapped = declared.clone();
        swapped.swap(1, 2);
        let error = check_call_order(&declared, &swapped, |_| true).unwrap_err();
        assert!(error.contains("position 1"), "{error}");
        let mut repeated = declared.clone();
        repeated.push(Site::Logits);
        let error = check_call_order(&declared, &repeated, |_| true).unwrap_err();
        assert!(error.contains("more than once"), "{error}");
        let mut extra = declared.clone();
        extra.push(Site::NextTokenProbs);
        let error = check_call_order(&declared, &extra, |_| true).unwrap_err();
        assert!(
            error.contains("next_token_probs` served undeclared"),
            "{error}"
        );
    }
}
