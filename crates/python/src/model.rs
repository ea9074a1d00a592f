//! `hookscope.Model`: loading, the site table, traces and generation.

use hookscope::analysis::GradMetric;
use hookscope::decoding::DecodingChoice;
use hookscope::hooks::RequestSpecs;
use hookscope::precision::parse_dtype_choice;
use hookscope::schema::CallDims;
use hookscope::{
    AttachOptions, Batch, DeviceChoice, Generation, Interventions, LoadOptions, MatmulPrecision,
    Model, ModelSource, Run, Saved, Steps, WeightDtype,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::arrays::{operand, rows_to_numpy, to_numpy};
use crate::errors::{InputError, IntoPyResult};
use crate::run::PyRun;

/// A loaded model.
#[pyclass(name = "Model", module = "hookscope", frozen)]
pub struct PyModel {
    /// Boxed: the model holds 64-byte-aligned values, and Python allocates its objects with
    /// less alignment than that.
    model: Box<Model>,
}

/// Attaches the dictionaries `specs` names (`"[SITE=]PATH"` each) to `model`.
fn attach_all(model: &mut Model, specs: &[String], without_error: bool) -> hookscope::Result<()> {
    for spec in specs {
        let (options, path) = AttachOptions::parse(spec, without_error);
        let dictionaries = ModelSource::load_dictionaries(&path, model.device())?;
        model.attach_all(dictionaries, options)?;
    }
    Ok(())
}

/// The requests of one call, in the CLI's syntax.
struct Requests<'py> {
    save: Option<Vec<String>>,
    save_grad: Option<Vec<String>>,
    zero: Option<Vec<String>>,
    add: Option<Bound<'py, PyDict>>,
    set: Option<Bound<'py, PyDict>>,
}

impl Requests<'_> {
    /// The interventions they make on `model`.
    fn interventions(
        self,
        model: &Model,
        default_steps: &Steps,
        generating: bool,
    ) -> PyResult<Interventions> {
        let values = |dict: Option<Bound<'_, PyDict>>, what: &str| -> PyResult<Vec<_>> {
            let Some(dict) = dict else {
                return Ok(Vec::new());
            };
            dict.iter()
                .map(|(key, value)| {
                    let target: String = key.extract().map_err(|_| {
                        InputError::new_err(format!("{what}: keys are site strings"))
                    })?;
                    let value = operand(&value, &format!("{what}[{target:?}]"))?;
                    Ok((target, value))
                })
                .collect()
        };
        let specs = RequestSpecs {
            save: self.save.unwrap_or_default(),
            save_grad: self.save_grad.unwrap_or_default(),
            zero: self.zero.unwrap_or_default(),
            add_values: values(self.add, "add")?,
            set_values: values(self.set, "set")?,
            ..RequestSpecs::default()
        };
        specs
            .interventions(model.layout(), default_steps, generating, model.device())
            .py()
    }
}

impl PyModel {
    /// Prompts as text (one string or a list) or as token ids (a list of lists).
    fn batch(&self, prompts: &Bound<'_, PyAny>) -> PyResult<Batch> {
        if let Ok(text) = prompts.extract::<String>() {
            return self.model.encode(&[text.as_str()]).py();
        }
        if let Ok(texts) = prompts.extract::<Vec<String>>() {
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            return self.model.encode(&texts).py();
        }
        if let Ok(ids) = prompts.extract::<Vec<Vec<u32>>>() {
            return self.model.batch(ids).py();
        }
        Err(InputError::new_err(
            "prompts: a string, a list of strings, or a list of token id lists",
        ))
    }

    /// A token given as an id or as text that is one token; `what` names the argument.
    fn token(&self, token: &Bound<'_, PyAny>, what: &str) -> PyResult<u32> {
        if let Ok(id) = token.extract::<u32>() {
            return Ok(id);
        }
        let text: String = token.extract().map_err(|_| {
            InputError::new_err(format!("{what}: a token id or a one-token string"))
        })?;
        let ids = self.encode(&text)?;
        match ids.as_slice() {
            [id] => Ok(*id),
            _ => Err(InputError::new_err(format!(
                "{what}: {text:?} is {} tokens, not one",
                ids.len()
            ))),
        }
    }

    /// The batch and requests of a call; a request without `@STEPS` binds to step 0 of a trace
    /// and to every step of a generation.
    fn prepare(
        &self,
        prompts: &Bound<'_, PyAny>,
        requests: Requests<'_>,
        generating: bool,
    ) -> PyResult<(Batch, Interventions)> {
        let batch = self.batch(prompts)?;
        let default_steps = if generating { Steps::All } else { Steps::At(0) };
        let interventions = requests.interventions(&self.model, &default_steps, generating)?;
        Ok((batch, interventions))
    }

    /// Each row's text (padding skipped) from `start` on.
    fn decode_rows(
        &self,
        ids: &[Vec<u32>],
        mask: &[Vec<bool>],
        start: usize,
    ) -> PyResult<Vec<String>> {
        ids.iter()
            .zip(mask)
            .map(|(row, real)| {
                let tokens: Vec<u32> = row[start.min(row.len())..]
                    .iter()
                    .zip(&real[start.min(real.len())..])
                    .filter(|(_, real)| **real)
                    .map(|(id, _)| *id)
                    .collect();
                match self.model.tokenizer() {
                    Some(tokenizer) => tokenizer.decode(&tokens).py(),
                    None => Ok(format!("{tokens:?}")),
                }
            })
            .collect()
    }

    fn result(
        &self,
        py: Python<'_>,
        saved: &hookscope::Saved,
        (ids, mask): (&[Vec<u32>], &[Vec<bool>]),
        (prompt_len, steps): (usize, usize),
    ) -> PyResult<PyRun> {
        let dict = PyDict::new(py);
        for entry in saved.iter() {
            dict.set_item(entry.key(), to_numpy(py, entry.to_data())?)?;
        }
        let padded = mask.iter().flatten().any(|real| !real);
        let attention_mask = match padded {
            true => rows_to_numpy(py, mask)?.unbind(),
            false => py.None(),
        };
        let new_text = match steps > 1 || prompt_len < ids.first().map_or(0, Vec::len) {
            true => self.decode_rows(ids, mask, prompt_len)?,
            false => vec![String::new(); ids.len()],
        };
        Ok(PyRun {
            saved: dict.unbind(),
            grads: PyDict::new(py).unbind(),
            metric: None,
            output_ids: rows_to_numpy(py, ids)?.unbind(),
            attention_mask,
            text: self.decode_rows(ids, mask, 0)?,
            new_text,
            steps,
        })
    }
}

#[pymethods]
impl PyModel {
    /// Loads `model`: a local Hugging Face directory, a hub id, or None for the embedded
    /// default model. `dtype`: the precision weights are stored in, "auto" (None: the config's
    /// `dtype`, else the checkpoint's), "float32", "bfloat16" or "float16" (also `f32`, `bf16`,
    /// `f16`, or a torch dtype's name). `matmul_precision`: "float32" (None: exact products of
    /// the stored weights) or "bfloat16" (with bf16 weights on the CPU: activations rounded to
    /// bf16 entering each product, sums in f32; torch's "highest"/"medium" also name them).
    /// `device`: "cpu" (None), or "wgpu[:N]", "vulkan[:N]", "cuda[:N]", "ndarray" where the
    /// package was built with that backend's feature.
    ///
    /// `sae`: feature dictionaries to attach, each `"[SITE=]PATH"` (a SAELens folder, a Gemma
    /// Scope params.npz): their values become sites (`SITE.sae.features`,
    /// `SITE.sae.reconstruction`, `SITE.sae.error`) to save and edit like any other.
    /// `sae_without_error`: replace those sites by the reconstruction alone. `gradients`: load
    /// for `trace(grad=...)` (every product as autodiff-recording tensor operations: slower).
    #[new]
    #[pyo3(signature = (
        model = None, *, dtype = None, matmul_precision = None, device = None, sae = None,
        sae_without_error = false, gradients = false
    ))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn new(
        py: Python<'_>,
        model: Option<String>,
        dtype: Option<String>,
        matmul_precision: Option<String>,
        device: Option<String>,
        sae: Option<Vec<String>>,
        sae_without_error: bool,
        gradients: bool,
    ) -> PyResult<Self> {
        let dtype = match dtype {
            Some(dtype) => parse_dtype_choice(&dtype)
                .map_err(|reason| InputError::new_err(format!("dtype={dtype:?}: {reason}")))?,
            None => None,
        };
        let matmul_precision = match matmul_precision {
            Some(text) => text.parse::<MatmulPrecision>().map_err(|reason| {
                InputError::new_err(format!("matmul_precision={text:?}: {reason}"))
            })?,
            None => MatmulPrecision::F32,
        };
        let device = match device {
            Some(name) => name
                .parse::<DeviceChoice>()
                .and_then(|choice| choice.open())
                .map_err(|error| InputError::new_err(format!("device={name:?}: {error}")))?,
            None => DeviceChoice::Cpu.open().py()?,
        };
        // Gradients need every product as burn's tensor operations, which record the backward
        // pass: the model is loaded on the device with autodiff.
        let device = match gradients {
            true => device.autodiff(),
            false => device,
        };
        let source = match model {
            Some(spec) => ModelSource::resolve(&spec).py()?,
            None => hookscope::default_model(),
        };
        let model = py
            .detach(|| {
                let options = LoadOptions {
                    dtype,
                    matmul_precision,
                };
                let mut model = Model::load_with(&source, &device, options)?;
                attach_all(
                    &mut model,
                    sae.as_deref().unwrap_or_default(),
                    sae_without_error,
                )?;
                Ok::<_, hookscope::Error>(model)
            })
            .py()?;
        Ok(PyModel {
            model: Box::new(model),
        })
    }

    /// A new Model sharing this one's weights, with feature dictionaries attached: each of
    /// `sae` is `"[SITE=]PATH"` as for the constructor's `sae=`. This model is unchanged.
    #[pyo3(signature = (sae, *, without_error = false))]
    fn attach(&self, py: Python<'_>, sae: Vec<String>, without_error: bool) -> PyResult<Self> {
        let mut model = self.model.as_ref().clone();
        py.detach(|| attach_all(&mut model, &sae, without_error))
            .py()?;
        Ok(PyModel {
            model: Box::new(model),
        })
    }

    /// The precision the weights are stored in: "float32", "bfloat16" or "float16".
    #[getter]
    fn dtype(&self) -> &'static str {
        match self.model.dtype() {
            WeightDtype::F32 => "float32",
            WeightDtype::Bf16 => "bfloat16",
            WeightDtype::F16 => "float16",
        }
    }

    /// Every site in call order: `{"name", "shape", "step0", "decode"}` with the symbolic
    /// shape and the shapes at the prompt call and at decode step `step`.
    #[pyo3(signature = (prompt_len = 10, step = 1, batch = 1))]
    fn sites<'py>(
        &self,
        py: Python<'py>,
        prompt_len: usize,
        step: usize,
        batch: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        if prompt_len.checked_add(step).is_none() {
            return Err(InputError::new_err("prompt_len + step overflows"));
        }
        let layout = self.model.layout();
        let prompt = CallDims::at_step(batch, prompt_len, 0);
        let decode = CallDims::at_step(batch, prompt_len, step.max(1));
        let rows = PyList::empty(py);
        for site in layout.call_order() {
            let row = PyDict::new(py);
            row.set_item("name", site.to_string())?;
            row.set_item("shape", layout.symbolic_shape(site).py()?.to_string())?;
            row.set_item("step0", layout.shape(site, prompt).py()?)?;
            row.set_item("decode", layout.shape(site, decode).py()?)?;
            rows.append(row)?;
        }
        Ok(rows)
    }

    /// One forward call (step 0) over `prompts`, with reads and writes in the CLI's syntax:
    /// `save=["layers.*.layer_output[:, -1]"]`, `zero=[...]`, `add={SITE: array}`,
    /// `set={SITE: array}` (arrays broadcast to the selected value). `grad`: a metric of the
    /// logits (`"logit-diff: A, B"`, `"logit:A"`, `"prob:A"`, `"logprob:A"`, each with an
    /// optional `@POS`, or `"loss"`), whose value comes back as `Run.metric` and whose gradient
    /// at the sites of `save_grad` (patterns, as `save`) as `Run.grads`; needs a model loaded
    /// with `gradients=True`.
    #[pyo3(signature = (
        prompts, *, save = None, zero = None, add = None, set = None, grad = None,
        save_grad = None
    ))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn trace<'py>(
        &self,
        py: Python<'py>,
        prompts: &Bound<'py, PyAny>,
        save: Option<Vec<String>>,
        zero: Option<Vec<String>>,
        add: Option<Bound<'py, PyDict>>,
        set: Option<Bound<'py, PyDict>>,
        grad: Option<String>,
        save_grad: Option<Vec<String>>,
    ) -> PyResult<PyRun> {
        let requests = Requests {
            save,
            save_grad,
            zero,
            add,
            set,
        };
        if grad.is_none() && requests.save_grad.is_some() {
            return Err(InputError::new_err(
                "save_grad: name the metric whose gradient to keep with grad=...",
            ));
        }
        let (batch, interventions) = self.prepare(prompts, requests, false)?;
        let (trace, gradients) = py
            .detach(|| {
                let mut trace = self.model.trace(&batch, &interventions)?;
                let gradients = match &grad {
                    Some(text) => {
                        let metric = GradMetric::parse(&self.model, text)?.measure(&trace)?;
                        let value = hookscope::host::f32_values(metric.to_data())?[0];
                        let gradients = match interventions.has_gradients() {
                            true => trace.gradients(&metric)?,
                            false => Saved::default(),
                        };
                        Some((value, gradients))
                    }
                    None => None,
                };
                Ok::<_, hookscope::Error>((trace, gradients))
            })
            .py()?;
        let mut run = self.result(
            py,
            &trace.saved,
            (&batch.ids, &batch.mask),
            (batch.len(), 1),
        )?;
        if let Some((value, gradients)) = gradients {
            let grads = PyDict::new(py);
            for entry in gradients.iter() {
                grads.set_item(entry.key(), to_numpy(py, entry.to_data())?)?;
            }
            run.grads = grads.unbind();
            run.metric = Some(value);
        }
        Ok(run)
    }

    /// Generates up to `max_new_tokens` tokens per prompt (greedy unless `greedy=False` or the
    /// checkpoint samples; `temperature`, `top_k`, `top_p` and `seed` as `transformers`). Reads
    /// and writes as in `trace`, with `@STEPS` (default: every step). `on_step(step)`, if given,
    /// is called before each step runs (a progress bar; an exception it raises stops the
    /// generation with it). Ctrl-C stops it between steps with `KeyboardInterrupt`.
    #[pyo3(signature = (
        prompts, max_new_tokens, *, greedy = None, temperature = None, top_k = None,
        top_p = None, seed = 0, save = None, zero = None, add = None, set = None, on_step = None
    ))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn generate<'py>(
        &self,
        py: Python<'py>,
        prompts: &Bound<'py, PyAny>,
        max_new_tokens: usize,
        greedy: Option<bool>,
        temperature: Option<f32>,
        top_k: Option<usize>,
        top_p: Option<f32>,
        seed: u64,
        save: Option<Vec<String>>,
        zero: Option<Vec<String>>,
        add: Option<Bound<'py, PyDict>>,
        set: Option<Bound<'py, PyDict>>,
        on_step: Option<Py<PyAny>>,
    ) -> PyResult<PyRun> {
        let requests = Requests {
            save,
            save_grad: None,
            zero,
            add,
            set,
        };
        let (batch, interventions) = self.prepare(prompts, requests, true)?;
        let choice = DecodingChoice {
            sample: greedy.map(|greedy| !greedy),
            temperature,
            top_k,
            top_p,
            seed,
        };
        let config = self
            .model
            .generation_config()
            .with_choice(max_new_tokens, &choice)
            .py()?;
        // Before each step: `on_step`, then the signals (Ctrl-C); the first error stops the run.
        let mut stopped = None;
        let generation: hookscope::Result<Generation> = py.detach(|| {
            let mut interrupted = |step: usize| {
                Python::attach(|py| {
                    let checked = match &on_step {
                        Some(callback) => callback.call1(py, (step,)).map(drop),
                        None => Ok(()),
                    };
                    match checked.and_then(|()| py.check_signals()) {
                        Ok(()) => false,
                        Err(error) => {
                            stopped = Some(error);
                            true
                        }
                    }
                })
            };
            let run = Run::new()
                .interventions(&interventions)
                .interrupt_when(&mut interrupted);
            self.model.generate(&batch, run, &config)
        });
        if let Some(error) = stopped {
            return Err(error);
        }
        let generation = generation.py()?;
        self.result(
            py,
            &generation.saved,
            (&generation.output_ids, &generation.attention_mask),
            (generation.prompt_len, generation.steps),
        )
    }

    /// The token ids of `text` (no special tokens added).
    fn encode(&self, text: &str) -> PyResult<Vec<u32>> {
        let tokenizer = self.model.tokenizer().ok_or_else(|| {
            InputError::new_err("this model has no tokenizer.json: pass token ids")
        })?;
        tokenizer.encode(text).py()
    }

    /// Direct logit attribution of `prompt`'s last position: the logit of `target` (less that
    /// of `vs`), tokens as ids or one-token strings, split into `embeddings`, per layer its
    /// `mixer` (with `heads` and `mixer_rest` where it is softmax attention) and `mlp`, and the
    /// `final_norm_bias` and `head_bias`; they sum to `logit` (before any final soft-cap).
    #[pyo3(signature = (prompt, target, *, vs = None))]
    fn dla<'py>(
        &self,
        py: Python<'py>,
        prompt: &Bound<'py, PyAny>,
        target: &Bound<'py, PyAny>,
        vs: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let batch = self.batch(prompt)?;
        let target = self.token(target, "target")?;
        let versus = vs.map(|token| self.token(token, "vs")).transpose()?;
        let attribution = py
            .detach(|| {
                hookscope::analysis::logit_attribution(
                    &self.model,
                    &batch,
                    target,
                    versus,
                    &Interventions::new(),
                )
            })
            .py()?;
        let report = PyDict::new(py);
        report.set_item("target", attribution.target)?;
        report.set_item("vs", attribution.versus)?;
        report.set_item("logit", attribution.logit)?;
        report.set_item("embeddings", attribution.embeddings)?;
        let layers = PyList::empty(py);
        for layer in &attribution.layers {
            let row = PyDict::new(py);
            row.set_item("layer", layer.layer)?;
            row.set_item("mixer", layer.mixer.total)?;
            row.set_item("heads", layer.mixer.heads.clone())?;
            row.set_item("mixer_rest", layer.mixer.rest)?;
            row.set_item("mlp", layer.mlp)?;
            layers.append(row)?;
        }
        report.set_item("layers", layers)?;
        report.set_item("final_norm_bias", attribution.final_norm_bias)?;
        report.set_item("head_bias", attribution.head_bias)?;
        report.set_item("sum", attribution.sum())?;
        Ok(report)
    }

    /// The text of token ids.
    fn decode(&self, ids: Vec<u32>) -> PyResult<String> {
        match self.model.tokenizer() {
            Some(tokenizer) => tokenizer.decode(&ids).py(),
            None => Ok(format!("{ids:?}")),
        }
    }

    fn __repr__(&self) -> String {
        let layout = self.model.layout();
        format!(
            "Model({}, {} layers, hidden {}, vocabulary {})",
            self.model.architecture().name,
            layout.layers.len(),
            layout.hidden,
            layout.vocab
        )
    }
}
