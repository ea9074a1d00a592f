//! The conformance suite: contract checks written once and run against every registered
//! adapter, on a tiny model of it with seeded random weights (no fixture needed), plus parity
//! with `transformers` wherever reference fixtures exist.

use std::collections::BTreeMap;
use std::path::Path;

use crate::fixture::{Fixture, fixtures_in};
use crate::order::{Recorder, check_call_order};
use crate::parity::{all_sites, check_generation, check_prompt_call};
use crate::report::{ArchReport, CheckOutcome, Status};
use hookscope::burn::tensor::Device;
use hookscope::decoding::argmax;
use hookscope::hooks::{Action, Write};
use hookscope::schema::{CallDims, MixerKind};
use hookscope::{
    Architecture, Decoding, Generation, GenerationConfig, Interventions, LayerSite, MixerSite,
    Model, Run, Site, SiteValue, Steps,
};

/// Decode steps after the prompt call.
const STEPS: usize = 4;
/// Tolerance of the numerical checks (f32).
const TOLERANCE: f32 = 1e-4;
/// Seed of the random weights.
const SEED: u64 = 7;

/// What a check that did not fail found.
enum Checked {
    /// It ran and held.
    Pass,
    /// It does not apply to this architecture.
    NotApplicable,
}

/// A check's result: what it found, or the first difference (or error) as the failure's detail.
type CheckResult = Result<Checked, String>;

/// Runs every check against every registered architecture (built-in, linked or plugin);
/// parity against the fixtures in `fixtures`, skipped when there is no such folder. Every model
/// runs on `device`.
pub fn run_all(fixtures: Option<&Path>, device: &Device) -> Vec<ArchReport> {
    hookscope::registry::registered()
        .into_iter()
        .map(|arch| run(arch, fixtures, device))
        .collect()
}

/// Runs every check against one architecture on `device`.
pub fn run(arch: &'static Architecture, fixtures: Option<&Path>, device: &Device) -> ArchReport {
    let mut checks = Vec::new();
    let mut record = |check: &'static str, result: CheckResult| {
        let (status, detail) = match result {
            Ok(Checked::Pass) => (Status::Pass, String::new()),
            Ok(Checked::NotApplicable) => (Status::NotApplicable, String::new()),
            Err(detail) => (Status::Fail, detail),
        };
        checks.push(CheckOutcome {
            check,
            status,
            detail,
        });
    };
    match Subject::new(arch, device) {
        Err(error) => record("loads", Err(error)),
        Ok(subject) => {
            record("loads", Ok(Checked::Pass));
            record("sites served once", subject.served_once());
            record("contract order", subject.contract_order());
            record("shape table", subject.shape_table());
            record("cache grows", subject.cache_grows());
            record("state carried", subject.state_carried());
            record("next_token_probs", subject.next_token_probs());
            record("attention probabilities", subject.attention_probabilities());
            record("residual write at step k", subject.residual_write());
            record("padded batch", subject.padded_batch());
            record("cache = recompute", subject.cache_equals_recompute());
            record("residual identity", subject.residual_identity());
            record("head writes sum", subject.head_writes_sum());
            record("logit attribution sums", subject.logit_attribution_sums());
        }
    }
    match fixtures {
        Some(fixtures) => record("transformers parity", parity(arch, fixtures, device)),
        None => checks.push(CheckOutcome {
            check: "transformers parity",
            status: Status::Skipped,
            detail: format!(
                "no fixtures folder (pass --fixtures DIR or set {})",
                crate::FIXTURES_ENV
            ),
        }),
    }
    ArchReport {
        arch: arch.name,
        checks,
    }
}

/// A tiny random model of one architecture and the runs the checks share.
struct Subject {
    model: Model,
    prompts: Vec<Vec<u32>>,
    config: GenerationConfig,
    /// Every site saved at every step of a generation of both prompts, padded.
    batch_run: Generation,
    /// The sites `batch_run` served, per step, in order.
    batch_order: Vec<Vec<Site>>,
}

fn error(e: hookscope::Error) -> String {
    e.to_string()
}

fn floats(value: &SiteValue) -> Result<Vec<f32>, String> {
    value
        .to_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| format!("{e:?}"))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| if x == y { 0.0 } else { (x - y).abs() })
        .fold(0.0, f32::max)
}

fn save_all(model: &Model) -> Interventions {
    model
        .layout()
        .call_order()
        .into_iter()
        .fold(Interventions::new(), |acc, site| acc.save(site, Steps::All))
}

impl Subject {
    fn new(arch: &'static Architecture, device: &Device) -> Result<Subject, String> {
        let model = Model::random(arch, SEED, device).map_err(error)?;
        let vocab = model.layout().vocab as u32;
        let prompts = vec![
            (0..6).map(|i| (i * 7 + 3) % vocab).collect(),
            (0..3).map(|i| (i * 5 + 1) % vocab).collect(),
        ];
        let mut config = model.generation_config().clone();
        config.decoding = Decoding::Greedy;
        config.max_new_tokens = STEPS;
        config.eos_token_ids.clear();
        let batch = model.batch(prompts.clone()).map_err(error)?;
        let mut recorder = Recorder::default();
        let requests = save_all(&model);
        let run = Run::new().interventions(&requests).observer(&mut recorder);
        let batch_run = model.generate(&batch, run, &config).map_err(error)?;
        Ok(Subject {
            model,
            prompts,
            config,
            batch_run,
            batch_order: recorder.steps,
        })
    }

    fn saved(&self, run: &Generation, site: Site, step: usize) -> Result<Vec<f32>, String> {
        let value = run
            .saved
            .get(site, step)
            .ok_or_else(|| format!("{site}@{step} was not served"))?;
        floats(value)
    }

    fn served_once(&self) -> CheckResult {
        let declared = self.model.layout().call_order();
        for (step, served) in self.batch_order.iter().enumerate() {
            let mut counts: BTreeMap<Site, i64> = BTreeMap::new();
            for site in served {
                *counts.entry(*site).or_default() += 1;
            }
            for site in &declared {
                *counts.entry(*site).or_default() -= 1;
            }
            if let Some((site, n)) = counts.iter().find(|(_, n)| **n != 0) {
                let what = if *n > 0 {
                    "served undeclared or twice"
                } else {
                    "declared, not served"
                };
                return Err(format!("step {step}: `{site}` {what}"));
            }
        }
        Ok(Checked::Pass)
    }

    fn contract_order(&self) -> CheckResult {
        let declared = self.model.layout().call_order();
        for (step, served) in self.batch_order.iter().enumerate() {
            if let Some(i) =
                (0..declared.len().max(served.len())).find(|i| declared.get(*i) != served.get(*i))
            {
                let name = |s: Option<&Site>| s.map_or("nothing".into(), ToString::to_string);
                return Err(format!(
                    "every site observed: step {step}, position {i}: served `{}`, the \
                     declaration says `{}`",
                    name(served.get(i)),
                    name(declared.get(i))
                ));
            }
        }
        // The same contract where fused kernels may run: no site observed, and one interior
        // site observed per layer (the mixer's last, its head outputs).
        let head_outputs: Vec<Site> = declared
            .iter()
            .copied()
            .filter(|site| {
                matches!(site, Site::Layer { site: LayerSite::Mixer(_, interior), .. }
                    if *interior == MixerSite::AttentionHeadOutputs)
            })
            .collect();
        for (what, observed) in [
            ("no site observed", vec![]),
            ("head outputs observed", head_outputs),
        ] {
            let requests = observed.iter().fold(Interventions::new(), |acc, site| {
                acc.save(*site, Steps::All)
            });
            let batch = self.model.batch(self.prompts.clone()).map_err(error)?;
            let mut recorder = Recorder::default();
            let run = Run::new().interventions(&requests).observer(&mut recorder);
            self.model
                .generate(&batch, run, &self.config)
                .map_err(error)?;
            for (step, served) in recorder.steps.iter().enumerate() {
                check_call_order(&declared, served, |site| observed.contains(site))
                    .map_err(|e| format!("{what}: step {step}: {e}"))?;
            }
        }
        Ok(Checked::Pass)
    }

    fn shape_table(&self) -> CheckResult {
        let layout = self.model.layout();
        let len = self.batch_run.prompt_len;
        for step in 0..self.batch_run.steps {
            let dims = CallDims::at_step(self.prompts.len(), len, step);
            for site in layout.call_order() {
                let got = self
                    .batch_run
                    .saved
                    .get(site, step)
                    .map(SiteValue::shape)
                    .ok_or_else(|| format!("{site}@{step} was not served"))?;
                let expected = layout.shape(site, dims).map_err(error)?;
                if got != expected {
                    let symbolic = layout.symbolic_shape(site).map_err(error)?;
                    return Err(format!(
                        "{site}@{step}: shape {got:?}, the table says {symbolic} = {expected:?}"
                    ));
                }
            }
        }
        Ok(Checked::Pass)
    }

    /// `layer_output = layer_input + attention_output + mlp_output` at every layer and step:
    /// the two outputs are what the block adds to the residual stream (after a post-norm,
    /// where the block has one), on sequential and parallel blocks alike.
    fn residual_identity(&self) -> CheckResult {
        let layers = &self.model.layout().layers;
        for step in 0..self.batch_run.steps {
            for (layer, spec) in layers.iter().enumerate() {
                let site = |site| self.saved(&self.batch_run, Site::layer(layer, site), step);
                let mut sum = site(LayerSite::LayerInput)?;
                let mut parts = vec![site(LayerSite::AttentionOutput)?];
                if spec.has_mlp() {
                    parts.push(site(LayerSite::MlpOutput)?);
                }
                for part in parts {
                    if part.len() != sum.len() {
                        return Err(format!("layer {layer}, step {step}: shapes differ"));
                    }
                    sum.iter_mut().zip(part).for_each(|(s, p)| *s += p);
                }
                let output = site(LayerSite::LayerOutput)?;
                let scale = output.iter().fold(1.0f32, |m, v| m.max(v.abs()));
                let diff = max_diff(&sum, &output);
                if diff > 1e-5 * scale {
                    return Err(format!(
                        "layer {layer}, step {step}: layer_output differs from layer_input + \
                         attention_output + mlp_output by {diff:.2e}"
                    ));
                }
                if spec.has(LayerSite::ResidualMid) {
                    let mut mid = site(LayerSite::LayerInput)?;
                    let attention = site(LayerSite::AttentionOutput)?;
                    mid.iter_mut().zip(attention).for_each(|(m, a)| *m += a);
                    let diff = max_diff(&mid, &site(LayerSite::ResidualMid)?);
                    if diff > 1e-5 * scale {
                        return Err(format!(
                            "layer {layer}, step {step}: residual_mid differs from layer_input + \
                             attention_output by {diff:.2e}"
                        ));
                    }
                }
            }
        }
        Ok(Checked::Pass)
    }

    /// Each softmax-attention layer's head writes are a decomposition of its output
    /// projection: written back as served (their sum plus the projection's bias flows on), the
    /// run is the unedited one. With a head's write zeroed, the output changes.
    fn head_writes_sum(&self) -> CheckResult {
        let layout = self.model.layout();
        let writes: Vec<Site> = layout
            .call_order()
            .into_iter()
            .filter(|site| {
                matches!(
                    site,
                    Site::Layer {
                        site: LayerSite::Mixer(_, MixerSite::AttentionHeadWrites),
                        ..
                    }
                )
            })
            .collect();
        if writes.is_empty() {
            return Ok(Checked::NotApplicable);
        }
        let batch = self
            .model
            .batch(vec![self.prompts[0].clone()])
            .map_err(error)?;
        let reads = writes.iter().fold(Interventions::new(), |acc, site| {
            acc.save(*site, Steps::At(0))
        });
        let plain = self.model.trace(&batch, &reads).map_err(error)?;
        let logits = |trace: &hookscope::Trace| -> Result<Vec<f32>, String> {
            floats(&SiteValue::Float3(trace.logits().map_err(error)?.clone()))
        };
        let expected = logits(&plain)?;
        let mut written = Interventions::new();
        for site in &writes {
            let value = plain.saved.require(*site, 0).map_err(error)?.clone();
            written = written.set(*site, Steps::At(0), value);
        }
        let rewritten = self.model.trace(&batch, &written).map_err(error)?;
        let scale = expected.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let diff = max_diff(&logits(&rewritten)?, &expected);
        if diff > TOLERANCE * scale {
            return Err(format!(
                "the heads' writes written back as served change the logits by {diff:.2e}: \
                 their sum plus the bias is not the output projection"
            ));
        }
        let mut zeroed = Interventions::new();
        let head = hookscope::hooks::Index::parse(":, :, 0")?;
        zeroed.push_indexed(writes[0], head, Steps::At(0), Action::Write(Write::Zero));
        let ablated = self.model.trace(&batch, &zeroed).map_err(error)?;
        if max_diff(&logits(&ablated)?, &expected) == 0.0 {
            return Err(format!(
                "zeroing head 0 of `{}` left the logits unchanged",
                writes[0]
            ));
        }
        Ok(Checked::Pass)
    }

    /// Direct logit attribution of the first prompt's last position: its parts and biases sum
    /// to the logit, and the final norm's bias part is the head applied to the final norm of a
    /// zero residual (its bias) less the head's own bias.
    fn logit_attribution_sums(&self) -> CheckResult {
        let batch = self
            .model
            .batch(vec![self.prompts[0].clone()])
            .map_err(error)?;
        let attribution = hookscope::analysis::logit_attribution(
            &self.model,
            &batch,
            1,
            Some(0),
            &Interventions::new(),
        )
        .map_err(error)?;
        let scale = attribution.logit.abs().max(1.0);
        let diff = (attribution.sum() - attribution.logit).abs();
        if diff > TOLERANCE * scale {
            return Err(format!(
                "the parts sum to {}, the logit difference is {}",
                attribution.sum(),
                attribution.logit
            ));
        }
        let hidden = self.model.layout().hidden;
        let device = self.model.device();
        let zero = hookscope::burn::tensor::Tensor::<3>::zeros([1, 1, hidden], device);
        let head = self.model.output_head();
        let heads = |x| floats(&SiteValue::Float3(head.head(x)));
        let bias = heads(head.final_norm(zero.clone()))?;
        let own = heads(zero)?;
        let expected = (bias[1] - own[1]) - (bias[0] - own[0]);
        if (attribution.final_norm_bias - expected).abs() > TOLERANCE * scale {
            return Err(format!(
                "the final norm's bias part is {}, its bias through the head {expected}",
                attribution.final_norm_bias
            ));
        }
        let heads_and_rest: f32 = attribution
            .layers
            .iter()
            .filter_map(|layer| {
                let heads: f32 = layer.mixer.heads.as_ref()?.iter().sum();
                Some((layer.mixer.total - heads - layer.mixer.rest?).abs())
            })
            .fold(0.0, f32::max);
        if heads_and_rest > TOLERANCE * scale {
            return Err(format!(
                "a layer's heads and rest miss its mixer's part by {heads_and_rest:.2e}"
            ));
        }
        Ok(Checked::Pass)
    }

    fn attention_layers(&self) -> Vec<usize> {
        let layers = &self.model.layout().layers;
        (0..layers.len())
            .filter(|i| matches!(layers[*i].mixer, MixerKind::SoftmaxAttention { .. }))
            .collect()
    }

    fn cache_grows(&self) -> CheckResult {
        let layers = self.attention_layers();
        if layers.is_empty() {
            return Ok(Checked::NotApplicable);
        }
        for layer in layers {
            let site = Site::self_attn(layer, MixerSite::AttentionKeys);
            for step in 1..self.batch_run.steps {
                let before = self.saved(&self.batch_run, site, step - 1)?;
                let after = self.saved(&self.batch_run, site, step)?;
                // [B, NKV, S, D]: every (b, head) block of S rows gains one row at the end.
                let shape = self.batch_run.saved.get(site, step).map(SiteValue::shape);
                let Some([b, heads, positions, dim]) =
                    shape.as_deref().map(|s| [s[0], s[1], s[2], s[3]])
                else {
                    return Err(format!("{site}@{step}: not rank 4"));
                };
                if before.len() != b * heads * (positions - 1) * dim {
                    return Err(format!(
                        "{site}@{step}: {positions} positions after step {} had {}",
                        step - 1,
                        before.len() / (b * heads * dim).max(1)
                    ));
                }
                for block in 0..b * heads {
                    let old =
                        &before[block * (positions - 1) * dim..(block + 1) * (positions - 1) * dim];
                    let new = &after[block * positions * dim..block * positions * dim + old.len()];
                    if old != new {
                        return Err(format!("{site}@{step}: earlier positions changed"));
                    }
                }
            }
        }
        Ok(Checked::Pass)
    }

    fn state_carried(&self) -> CheckResult {
        let layout = self.model.layout();
        let recurrent: Vec<(Site, Site)> = layout
            .call_order()
            .into_iter()
            .filter_map(|site| match site {
                Site::Layer {
                    layer,
                    site: LayerSite::Mixer(namespace, MixerSite::StateInput),
                } => Some((
                    site,
                    Site::layer(layer, LayerSite::Mixer(namespace, MixerSite::StateOutput)),
                )),
                _ => None,
            })
            .collect();
        if recurrent.is_empty() {
            return Ok(Checked::NotApplicable);
        }
        for (input, output) in recurrent {
            let first = self.saved(&self.batch_run, input, 0)?;
            if first.iter().any(|x| *x != 0.0) {
                return Err(format!("{input}@0 is not zero"));
            }
            for step in 1..self.batch_run.steps {
                let carried = self.saved(&self.batch_run, output, step - 1)?;
                let received = self.saved(&self.batch_run, input, step)?;
                if carried != received {
                    return Err(format!("{input}@{step} differs from {output}@{}", step - 1));
                }
            }
        }
        Ok(Checked::Pass)
    }

    fn next_token_probs(&self) -> CheckResult {
        let vocab = self.model.layout().vocab;
        for step in 0..self.batch_run.steps {
            let probs = self.saved(&self.batch_run, Site::NextTokenProbs, step)?;
            for (row, dist) in probs.chunks(vocab).enumerate() {
                let sum: f32 = dist.iter().sum();
                if (sum - 1.0).abs() > TOLERANCE {
                    return Err(format!("step {step} row {row}: sums to {sum}"));
                }
                let appended = self.batch_run.new_tokens(row)[step];
                if argmax(dist) != appended {
                    return Err(format!(
                        "step {step} row {row}: argmax {} but appended {appended}",
                        argmax(dist)
                    ));
                }
            }
        }
        Ok(Checked::Pass)
    }

    fn attention_probabilities(&self) -> CheckResult {
        let Some(&layer) = self.attention_layers().first() else {
            return Ok(Checked::NotApplicable);
        };
        let site = Site::self_attn(layer, MixerSite::AttentionProbabilities);
        for step in 0..self.batch_run.steps {
            let shape = self
                .batch_run
                .saved
                .get(site, step)
                .map(SiteValue::shape)
                .unwrap_or_default();
            let positions = shape.last().copied().unwrap_or(1);
            for (row, probs) in self
                .saved(&self.batch_run, site, step)?
                .chunks(positions)
                .enumerate()
            {
                let sum: f32 = probs.iter().sum();
                if (sum - 1.0).abs() > TOLERANCE {
                    return Err(format!("{site}@{step}, row {row}: sums to {sum}"));
                }
            }
        }
        let batch = self
            .model
            .batch(vec![self.prompts[0].clone()])
            .map_err(error)?;
        let logits = |interventions: Interventions| -> Result<Vec<f32>, String> {
            let trace = self
                .model
                .trace(&batch, &interventions.save(Site::Logits, Steps::At(0)))
                .map_err(error)?;
            floats(trace.saved.get(Site::Logits, 0).ok_or("no logits")?)
        };
        let plain = logits(Interventions::new())?;
        let written = logits(Interventions::new().zero(site, Steps::At(0)))?;
        if max_diff(&plain, &written) == 0.0 {
            return Err(format!("zeroing {site} left the logits unchanged"));
        }
        Ok(Checked::Pass)
    }

    fn residual_write(&self) -> CheckResult {
        let layout = self.model.layout();
        let site = Site::layer(layout.layers.len() / 2, LayerSite::LayerOutput);
        let k = 2;
        let batch = self
            .model
            .batch(vec![self.prompts[0].clone()])
            .map_err(error)?;
        let reads = save_all(&self.model);
        let plain = self
            .model
            .generate(&batch, &reads, &self.config)
            .map_err(error)?;
        let edited = self
            .model
            .generate(
                &batch,
                &reads.clone().zero(site, Steps::At(k)),
                &self.config,
            )
            .map_err(error)?;
        for step in 0..k {
            for s in layout.call_order() {
                if self.saved(&plain, s, step)? != self.saved(&edited, s, step)? {
                    return Err(format!("writing {site}@{k} changed {s}@{step}"));
                }
            }
        }
        let a = self.saved(&plain, Site::Logits, k)?;
        let b = self.saved(&edited, Site::Logits, k)?;
        if max_diff(&a, &b) == 0.0 {
            return Err(format!(
                "zeroing {site}@{k} left step {k}'s logits unchanged"
            ));
        }
        Ok(Checked::Pass)
    }

    fn padded_batch(&self) -> CheckResult {
        let layout = self.model.layout();
        let last = Site::layer(layout.layers.len() - 1, LayerSite::LayerOutput);
        let reads = Interventions::new()
            .save(last, Steps::All)
            .save(Site::NextTokenProbs, Steps::All);
        let len = self.batch_run.prompt_len;
        for (row, prompt) in self.prompts.iter().enumerate() {
            let batch = self.model.batch(vec![prompt.clone()]).map_err(error)?;
            let alone = self
                .model
                .generate(&batch, &reads, &self.config)
                .map_err(error)?;
            if alone.new_tokens(0) != self.batch_run.new_tokens(row) {
                return Err(format!(
                    "row {row}: tokens {:?} alone, {:?} in the batch",
                    alone.new_tokens(0),
                    self.batch_run.new_tokens(row)
                ));
            }
            for step in 0..alone.steps {
                let together = self.saved(&self.batch_run, last, step)?;
                let single = self.saved(&alone, last, step)?;
                let per_row = together.len() / self.prompts.len();
                let hidden = layout.hidden;
                let tokens = per_row / hidden;
                let pad = if step == 0 { len - prompt.len() } else { 0 };
                let real = &together[row * per_row + pad * hidden..row * per_row + tokens * hidden];
                let diff = max_diff(real, &single);
                if diff > TOLERANCE {
                    return Err(format!("{last}@{step}, row {row}: max |diff| {diff:e}"));
                }
            }
        }
        Ok(Checked::Pass)
    }

    fn cache_equals_recompute(&self) -> CheckResult {
        let batch = self.model.batch(self.prompts.clone()).map_err(error)?;
        let reads = Interventions::new().save(Site::NextTokenProbs, Steps::All);
        let mut recompute = self.config.clone();
        recompute.use_cache = false;
        let cached = self
            .model
            .generate(&batch, &reads, &self.config)
            .map_err(error)?;
        let full = self
            .model
            .generate(&batch, &reads, &recompute)
            .map_err(error)?;
        if cached.output_ids != full.output_ids {
            return Err(format!(
                "tokens {:?} cached, {:?} recomputed",
                cached.output_ids, full.output_ids
            ));
        }
        for step in 0..cached.steps {
            let a = self.saved(&cached, Site::NextTokenProbs, step)?;
            let b = self.saved(&full, Site::NextTokenProbs, step)?;
            let diff = max_diff(&a, &b);
            if diff > TOLERANCE {
                return Err(format!("next_token_probs@{step}: max |diff| {diff:e}"));
            }
        }
        Ok(Checked::Pass)
    }
}

/// Parity with `transformers` on every fixture in `fixtures` whose `model_type` this
/// architecture serves; not applicable where there is none.
fn parity(arch: &'static Architecture, fixtures: &Path, device: &Device) -> CheckResult {
    let served: Vec<Fixture> = fixtures_in(fixtures)?
        .into_iter()
        .filter(|fixture| fixture.served_by(arch))
        .collect();
    if served.is_empty() {
        return Ok(Checked::NotApplicable);
    }
    for Fixture { name, dir, .. } in served {
        for report in [
            check_prompt_call(&dir, device, f64::from(TOLERANCE), all_sites),
            check_generation(&dir, device, f64::from(TOLERANCE)),
        ] {
            let report = report.map_err(|e| format!("{name}: {e}"))?;
            if let Some(first) = report.mismatches.first() {
                return Err(format!(
                    "{name}: {first} ({} mismatches)",
                    report.mismatches.len()
                ));
            }
        }
    }
    Ok(Checked::Pass)
}
