//! hookscope's errors as Python exceptions: `hookscope.Error` and one subclass per kind, with
//! the CLI's messages.

use pyo3::exceptions::{PyException, PyKeyboardInterrupt};
use pyo3::prelude::*;

pyo3::create_exception!(
    hookscope,
    Error,
    PyException,
    "Any hookscope error (the CLI's message)."
);
pyo3::create_exception!(
    hookscope,
    LoadError,
    Error,
    "A model, checkpoint, config, tokenizer or file that cannot be used."
);
pyo3::create_exception!(
    hookscope,
    SiteError,
    Error,
    "A site, pattern, index or steps request that does not fit the model or the run."
);
pyo3::create_exception!(
    hookscope,
    WriteError,
    Error,
    "A written value of the wrong shape or kind, or an edit that failed."
);
pyo3::create_exception!(
    hookscope,
    InputError,
    Error,
    "Prompts, options or values that cannot be run."
);

/// Adds the exception classes to the module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("Error", py.get_type::<Error>())?;
    module.add("LoadError", py.get_type::<LoadError>())?;
    module.add("SiteError", py.get_type::<SiteError>())?;
    module.add("WriteError", py.get_type::<WriteError>())?;
    module.add("InputError", py.get_type::<InputError>())?;
    Ok(())
}

/// The Python exception for a hookscope error.
pub fn to_py(error: hookscope::Error) -> PyErr {
    use hookscope::Error as E;
    let message = error.to_string();
    match error {
        E::Interrupted { .. } => PyKeyboardInterrupt::new_err(message),
        E::UnknownSite { .. }
        | E::LayerOutOfRange { .. }
        | E::SiteNotInArchitecture { .. }
        | E::PatternMatchesNothing(_)
        | E::StepsBeyondRun { .. }
        | E::InvalidSteps(_)
        | E::OutOfOrder { .. }
        | E::InvalidSpec { .. }
        | E::Index { .. } => SiteError::new_err(message),
        E::WriteShapeMismatch { .. } | E::WriteKindMismatch { .. } | E::Edit { .. } => {
            WriteError::new_err(message)
        }
        E::Io { .. }
        | E::Json { .. }
        | E::ConfigValue { .. }
        | E::UnsupportedConfig { .. }
        | E::Safetensors { .. }
        | E::TensorInFile { .. }
        | E::Weights { .. }
        | E::Tokenizer { .. }
        | E::UnknownArchitecture { .. }
        | E::ModelNotFound { .. }
        | E::Plugin { .. }
        | E::InsufficientMemory { .. }
        | E::LoadOption { .. } => LoadError::new_err(message),
        E::Tokenize(_)
        | E::InvalidInput(_)
        | E::NonFinite(_)
        | E::SamplingOptionUnderGreedy { .. }
        | E::RunOption { .. }
        | E::NotComputed { .. } => InputError::new_err(message),
        _ => Error::new_err(message),
    }
}

/// `map_err` for hookscope results.
pub trait IntoPyResult<T> {
    /// The result with a Python exception for the error.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for hookscope::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
