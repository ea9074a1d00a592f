//! Numerical parity with `transformers`: every site at the prompt call and at every step of a
//! greedy cached generation, the generated tokens, and an intervention's effect.

use std::path::Path;

use hookscope::burn::tensor::Device;
use hookscope::hooks::Action;
use hookscope::hooks::Write;
use hookscope::{
    Decoding, Interventions, LayerSite, MixerSite, Model, ModelSource, Saved, Site, Steps,
};

use crate::reference::{RefTensor, Reference, ReferenceError};

/// Why a parity check could not run.
#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    /// The fixture's reference could not be read.
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    /// hookscope failed to load or run the model.
    #[error(transparent)]
    Hookscope(#[from] hookscope::Error),
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
            site: LayerSite::Mixer(
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
    /// Keys of served values with no reference value (e.g. vocabulary-sized ones left out).
    pub unreferenced: Vec<String>,
    /// One line per mismatch: key, shapes or largest difference and where.
    pub mismatches: Vec<String>,
}

impl ParityReport {
    /// Adds `other`'s lines, each marked with `label` (what differed in the run it compared).
    fn absorb(&mut self, other: ParityReport, label: &str) {
        let marked = |lines: Vec<String>| {
            lines
                .into_iter()
                .map(move |line| format!("{line} ({label})"))
        };
        self.matched.extend(marked(other.matched));
        self.unreferenced.extend(marked(other.unreferenced));
        self.mismatches.extend(marked(other.mismatches));
    }
}

/// The sites of a generation run that saves only what the model outputs.
const OUTPUTS: [Site; 2] = [Site::Logits, Site::NextTokenProbs];

/// One fixture's comparison in progress: what is compared against what, and the report so far.
struct Comparison<'a> {
    reference: &'a Reference,
    /// The sites compared at every step.
    sites: &'a [Site],
    /// Largest absolute difference accepted.
    tolerance: f64,
    report: ParityReport,
}

impl Comparison<'_> {
    fn compare(
        &mut self,
        key: String,
        got: Option<RefTensor>,
        tolerance: f64,
    ) -> Result<(), ParityError> {
        let expected = self.reference.get(&key)?;
        let report = &mut self.report;
        match (got, expected) {
            (_, None) => report.unreferenced.push(key),
            (None, Some(_)) => report.mismatches.push(format!("{key}: not served")),
            (Some(got), Some(expected)) => match got.max_abs_diff(&expected) {
                None => report.mismatches.push(format!(
                    "{key}: shape {:?}, transformers has {:?}",
                    got.shape, expected.shape
                )),
                Some((diff, index)) if diff > tolerance => report.mismatches.push(format!(
                    "{key}: max |diff| {diff:.3e} at flat index {index} (hookscope {}, \
                     transformers {})",
                    got.values[index], expected.values[index]
                )),
                Some(_) => report.matched.push(key),
            },
        }
        Ok(())
    }

    /// Compares every site at `steps` steps of `saved` with `{prefix}/{site}@{step}`.
    fn compare_saved(
        &mut self,
        prefix: &str,
        saved: &Saved,
        steps: usize,
    ) -> Result<(), ParityError> {
        for step in 0..steps {
            for site in self.sites {
                let key = format!("{prefix}/{site}@{step}");
                let got = match saved
                    .get(*site, step)
                    .map(|v| RefTensor::from_data(&v.to_data()))
                {
                    Some(Err(message)) => {
                        self.report
                            .mismatches
                            .push(format!("{key}: unreadable value: {message}"));
                        continue;
                    }
                    other => other.and_then(Result::ok),
                };
                self.compare(key, got, self.tolerance)?;
            }
        }
        Ok(())
    }

    /// Compares generated token ids with `{prefix}/output_ids`, exactly.
    fn compare_ids(&mut self, prefix: &str, ids: &[u32]) -> Result<(), ParityError> {
        let got = RefTensor {
            shape: vec![ids.len()],
            values: ids.iter().map(|id| f64::from(*id)).collect(),
        };
        self.compare(format!("{prefix}/output_ids"), Some(got), 0.0)
    }
}

fn load(dir: &Path, device: &Device) -> Result<(Reference, Model), ParityError> {
    let reference = Reference::open(dir)?;
    let model = Model::load(&ModelSource::Directory(dir.to_path_buf()), device)?;
    Ok((reference, model))
}

fn save(sites: &[Site], steps: Steps) -> Interventions {
    sites.iter().fold(Interventions::new(), |acc, site| {
        acc.save(*site, steps.clone())
    })
}

/// Traces every prompt of the fixture in `dir` on `device` saving the sites `select` picks, and
/// compares each with the reference's step-0 value within `tolerance` (absolute).
///
/// Saving fewer sites exercises the unobserved fast paths (e.g. fused attention when no scores
/// or probabilities are read); every path must give the same numbers.
pub fn check_prompt_call(
    dir: &Path,
    device: &Device,
    tolerance: f64,
    select: impl Fn(&Site) -> bool,
) -> Result<ParityReport, ParityError> {
    let (reference, model) = load(dir, device)?;
    let sites: Vec<Site> = model
        .layout()
        .call_order()
        .into_iter()
        .filter(select)
        .collect();
    let interventions = save(&sites, Steps::At(0));
    let mut comparison = Comparison {
        reference: &reference,
        sites: &sites,
        tolerance,
        report: ParityReport::default(),
    };
    for (k, prompt) in reference.prompts.prompts.iter().enumerate() {
        let trace = model.trace(&model.batch(vec![prompt.clone()])?, &interventions)?;
        comparison.compare_saved(&format!("prompt{k}"), &trace.saved, 1)?;
    }
    Ok(comparison.report)
}

/// Generates greedily on `device` from every prompt of the fixture saving every site at every step, and
/// compares the tokens and every step's values with `transformers`' cached generation; then
/// repeats the reference's intervention run (a site zeroed at one step) and compares that too.
pub fn check_generation(
    dir: &Path,
    device: &Device,
    tolerance: f64,
) -> Result<ParityReport, ParityError> {
    let (reference, model) = load(dir, device)?;
    let sites = model.layout().call_order();
    let mut config = model.generation_config().clone();
    config.decoding = Decoding::Greedy;
    config.max_new_tokens = reference.prompts.new_tokens;
    // transformers generated exactly `new_tokens` tokens with no EOS.
    config.eos_token_ids.clear();
    let all = save(&sites, Steps::All);
    let mut comparison = Comparison {
        reference: &reference,
        sites: &sites,
        tolerance,
        report: ParityReport::default(),
    };
    let prompts = &reference.prompts.prompts;
    for (k, prompt) in prompts.iter().enumerate() {
        let batch = model.batch(vec![prompt.clone()])?;
        let generation = model.generate(&batch, &all, &config)?;
        let prefix = format!("prompt{k}");
        comparison.compare_ids(&prefix, &generation.output_ids[0])?;
        comparison.compare_saved(&prefix, &generation.saved, generation.steps)?;
        // With only the outputs saved no request reaches attention's interior, so the fused
        // paths run (on the CPU a decode step reads the cache in place): the same tokens and
        // distributions.
        let generation = model.generate(&batch, &save(&OUTPUTS, Steps::All), &config)?;
        let mut outputs_only = Comparison {
            sites: &OUTPUTS,
            report: ParityReport::default(),
            ..comparison
        };
        outputs_only.compare_ids(&prefix, &generation.output_ids[0])?;
        outputs_only.compare_saved(&prefix, &generation.saved, generation.steps)?;
        comparison
            .report
            .absorb(outputs_only.report, "only the outputs saved");
    }
    let zero = &reference.prompts.zero;
    let mut edited = all.clone();
    edited.push(
        model.layout().resolve(&zero.site)?,
        Steps::At(zero.step),
        Action::Write(Write::Zero),
    );
    let prompt = prompts.get(zero.prompt).cloned().unwrap_or_default();
    let generation = model.generate(&model.batch(vec![prompt])?, &edited, &config)?;
    comparison.compare_ids("zero0", &generation.output_ids[0])?;
    comparison.compare_saved("zero0", &generation.saved, generation.steps)?;
    Ok(comparison.report)
}
