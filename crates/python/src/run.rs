//! The result of a trace or a generation, as Python sees it.

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// What `Model.trace` and `Model.generate` return.
#[pyclass(name = "Run", module = "hookscope", frozen)]
pub struct PyRun {
    /// Saved values by key (`SITE[INDEX]@STEP`): float32 numpy arrays (int64 for `input_ids`).
    #[pyo3(get)]
    pub saved: Py<PyDict>,
    /// `[B, T0 + N]` int64: the left-padded prompts and the generated tokens.
    #[pyo3(get)]
    pub output_ids: Py<PyAny>,
    /// `[B, T0 + N]` int64 (1 at real tokens) for a padded batch, else None.
    #[pyo3(get)]
    pub attention_mask: Py<PyAny>,
    /// Each row's text: prompt and continuation, padding skipped.
    #[pyo3(get)]
    pub text: Vec<String>,
    /// Each row's continuation only (empty for a trace).
    #[pyo3(get)]
    pub new_text: Vec<String>,
    /// Gradients of `trace(grad=...)`'s metric by key (`SITE[INDEX]@0`), float32 arrays;
    /// empty without `grad`.
    #[pyo3(get)]
    pub grads: Py<PyDict>,
    /// The value of `trace(grad=...)`'s metric, else None.
    #[pyo3(get)]
    pub metric: Option<f32>,
    /// Calls made: 1 for a trace; for a generation, the tokens appended (fewer than asked when
    /// every row ended at EOS).
    #[pyo3(get)]
    pub steps: usize,
}

#[pymethods]
impl PyRun {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Run(steps={}, saved={} values, text={:?})",
            self.steps,
            self.saved.bind(py).len(),
            self.text
        )
    }
}
