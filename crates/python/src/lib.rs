//! `hookscope` for Python: PyO3 bindings over the same library the CLI uses. The request syntax
//! (`PATTERN[INDEX][@STEPS]`) is parsed by `hookscope::hooks::RequestSpecs`, so every CLI
//! spelling works here and every CLI error becomes a `hookscope.Error` subclass with the same
//! message. Arrays come back as numpy arrays that own the Rust buffers (no copy past the one
//! off the tensor).

mod arrays;
mod errors;
mod model;
mod run;

use pyo3::prelude::*;

/// The native module behind the `hookscope` package.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<model::PyModel>()?;
    module.add_class::<run::PyRun>()?;
    errors::register(module)?;
    Ok(())
}
