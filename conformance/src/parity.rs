//! Numerical parity with `transformers` at the prompt call: every site of the schema.

use std::path::Path;

use hookscope_core::{Interventions, MixerSite, Model, ModelSource, Site, Steps};

use crate::reference::{RefTensor, Reference, ReferenceError};

/// Why a parity check could not run.
#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    /// The fixture's reference could not be read.
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    /// hookscope failed to load or run the model.
    #[error(transparent)]
    Hookscope(#[from] hookscope_core::Error),
}

/// Selects every site.
pub fn all_sites(_: &Site) -> bool {
    true
}

/// Selects every site but attention scores and probabilities, so that attention takes its
/// fused path.
pub fn without_attention_pattern(site: &Site) -> bool {
    !matches!(
        site,
        Site::Layer {
            site: hookscope_core::LayerSite::Mixer(
                _,
                MixerSite::AttentionScores | MixerSite::AttentionProbabilities
            ),
            ..
        }
    )
}

/// The outcome of comparing one fixture.
#[derive(Debug, Clone, Default)]
pub struct ParityReport {
    /// Reference keys compared and within tolerance.
    pub matched: Vec<String>,
    /// Sites of the model with no reference value (e.g. vocabulary-sized ones left out).
    pub unreferenced: Vec<String>,
    /// One line per mismatch: key, shapes or largest difference and where.
    pub mismatches: Vec<String>,
}

/// Traces every prompt of the fixture in `dir` saving the sites `select` picks, and compares
/// each with the reference's step-0 value within `tolerance` (absolute).
///
/// Saving fewer sites exercises the unobserved fast paths (e.g. fused attention when no scores
/// or probabilities are read); every path must give the same numbers.
pub fn check_prompt_call(
    dir: &Path,
    tolerance: f64,
    select: impl Fn(&Site) -> bool,
) -> Result<ParityReport, ParityError> {
    let reference = Reference::open(dir)?;
    let device = Default::default();
    let model = Model::load(&ModelSource::Directory(dir.to_path_buf()), &device)?;
    let sites: Vec<Site> = model
        .layout()
        .call_order()
        .into_iter()
        .filter(select)
        .collect();
    let interventions = sites.iter().fold(Interventions::new(), |acc, site| {
        acc.save(*site, Steps::At(0))
    });
    let mut report = ParityReport::default();
    for (k, prompt) in reference.prompts.prompts.iter().enumerate() {
        let batch = model.batch(vec![prompt.clone()])?;
        let trace = model.trace(&batch, &interventions)?;
        for site in &sites {
            let key = format!("prompt{k}/{site}@0");
            let Some(expected) = reference.get(&key)? else {
                report.unreferenced.push(key);
                continue;
            };
            let Some(value) = trace.saved.get(*site, 0) else {
                report.mismatches.push(format!("{key}: not served"));
                continue;
            };
            let got = match RefTensor::from_data(&value.to_data()) {
                Ok(got) => got,
                Err(message) => {
                    report
                        .mismatches
                        .push(format!("{key}: unreadable value: {message}"));
                    continue;
                }
            };
            match got.max_abs_diff(&expected) {
                None => report.mismatches.push(format!(
                    "{key}: shape {:?}, transformers has {:?}",
                    got.shape, expected.shape
                )),
                Some((diff, index)) if diff > tolerance => report.mismatches.push(format!(
                    "{key}: max |diff| {diff:.3e} at flat index {index} (hookscope {}, transformers {})",
                    got.values[index], expected.values[index]
                )),
                Some(_) => report.matched.push(key),
            }
        }
    }
    Ok(report)
}
