//! The text form of requests, one parser for the CLI and the Python package:
//! `PATTERN[INDEX][@STEPS]` for saves and zeroing, and
//! `PATTERN[INDEX][@STEPS]=FILE.safetensors:KEY[*SCALE]` or `...=NUMBER` for additions
//! (`--add`) and sets (`--set`) of stored tensors or of one number broadcast to the selection.

use std::path::PathBuf;

use burn::tensor::Device;

use super::request::{Action, Interventions, Selection, Steps, Write};
use super::value::SiteValue;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::schema::{ModelLayout, SymbolicShape};

/// What a request argument does at the sites it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecKind {
    /// `--save PATTERN[INDEX][@STEPS]`.
    Save,
    /// `--zero PATTERN[INDEX][@STEPS]`.
    Zero,
    /// `--add PATTERN[INDEX][@STEPS]=FILE.safetensors:KEY[*SCALE]`.
    Add,
    /// `--set PATTERN[INDEX][@STEPS]=FILE.safetensors:KEY`.
    Set,
    /// `--save-grad PATTERN[INDEX]`: the gradient at the prompt call.
    Grad,
}

/// The request arguments of one run, each list in command-line order. At one site, sets apply
/// first, then additions, then zeroing; saves keep the value after every write.
#[derive(Debug, Clone, Default)]
pub struct RequestSpecs {
    /// Sites to save.
    pub save: Vec<String>,
    /// Sites whose gradient to keep (a trace on a model loaded for gradients).
    pub save_grad: Vec<String>,
    /// Sites to zero.
    pub zero: Vec<String>,
    /// Stored tensors or numbers to add (`TARGET=FILE.safetensors:KEY[*SCALE]`,
    /// `TARGET=NUMBER`).
    pub add: Vec<String>,
    /// Stored tensors or numbers to set (`TARGET=FILE.safetensors:KEY`, `TARGET=NUMBER`).
    pub set: Vec<String>,
    /// Tensors in memory to add, by target (`PATTERN[INDEX][@STEPS]`); after the stored ones.
    pub add_values: Vec<(String, Operand)>,
    /// Tensors in memory to set, by target; after the stored ones.
    pub set_values: Vec<(String, Operand)>,
}

/// A tensor in memory to write: row-major f32 values and their shape (any rank; it broadcasts
/// to the selected value).
#[derive(Debug, Clone, PartialEq)]
pub struct Operand {
    /// The values.
    pub values: Vec<f32>,
    /// The shape.
    pub shape: Vec<usize>,
}

/// A stored tensor named by `FILE.safetensors:KEY[*SCALE]`.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredTensor {
    /// The file.
    pub file: PathBuf,
    /// The tensor's key in it.
    pub key: String,
    /// The factor it is multiplied by (1 when not given).
    pub scale: f32,
}

impl StoredTensor {
    /// Parses `FILE.safetensors:KEY[*SCALE]`. Keys may hold `:` (saved keys such as
    /// `layers.0.layer_output[:, -1]@0` do), so the file ends at the first `.safetensors:`.
    pub fn parse(text: &str) -> std::result::Result<StoredTensor, String> {
        const SUFFIX: &str = ".safetensors:";
        let Some(end) = text.find(SUFFIX) else {
            return Err(format!(
                "`{text}` is not `FILE.safetensors:KEY[*SCALE]` (e.g. `steer.safetensors:honesty*4`)"
            ));
        };
        let file = PathBuf::from(&text[..end + SUFFIX.len() - 1]);
        let rest = &text[end + SUFFIX.len()..];
        let (key, scale) = match rest.rsplit_once('*') {
            None => (rest, 1.0),
            Some((key, scale)) => {
                let value: f32 = scale
                    .trim()
                    .parse()
                    .map_err(|_| format!("scale `{scale}` is not a number"))?;
                if !value.is_finite() {
                    return Err(format!("scale `{scale}` is not finite"));
                }
                (key, value)
            }
        };
        if key.is_empty() {
            return Err(format!("no key after `{}:`", file.display()));
        }
        Ok(StoredTensor {
            file,
            key: key.to_string(),
            scale,
        })
    }

    /// Reads the tensor as f32, scaled, with its shape.
    pub fn read(&self) -> Result<(Vec<f32>, Vec<usize>)> {
        let (mut values, shape) = Checkpoint::open_file(&self.file)?.tensor_f32(&self.key)?;
        if self.scale != 1.0 {
            values.iter_mut().for_each(|v| *v *= self.scale);
        }
        if let Some(at) = values.iter().position(|v| !v.is_finite()) {
            return Err(Error::TensorInFile {
                path: self.file.clone(),
                message: format!(
                    "tensor `{}` holds a non-finite value at flat index {at}",
                    self.key
                ),
            });
        }
        Ok((values, shape))
    }
}

impl RequestSpecs {
    /// The requests these arguments make on a model of `layout`, with operands on `device`.
    /// `default_steps` applies where an argument names no `@STEPS`; `generating` says whether
    /// the run has steps past 0 (a single trace has only step 0, so naming others is an error).
    pub fn interventions(
        &self,
        layout: &ModelLayout,
        default_steps: &Steps,
        generating: bool,
        device: &Device,
    ) -> Result<Interventions> {
        let mut interventions = Interventions::new();
        let groups = [
            (SpecKind::Set, &self.set),
            (SpecKind::Add, &self.add),
            (SpecKind::Zero, &self.zero),
            (SpecKind::Save, &self.save),
            (SpecKind::Grad, &self.save_grad),
        ];
        let context = SpecContext {
            layout,
            default_steps,
            generating,
            device,
        };
        for (kind, specs) in groups {
            for spec in specs {
                push_spec(&mut interventions, &context, kind, spec)?;
            }
            let values = match kind {
                SpecKind::Set => &self.set_values,
                SpecKind::Add => &self.add_values,
                _ => continue,
            };
            for (target, operand) in values {
                push_request(
                    &mut interventions,
                    &context,
                    kind,
                    target,
                    Some(operand.clone()),
                )?;
            }
        }
        Ok(interventions)
    }
}

/// What every argument of one run is read against.
struct SpecContext<'a> {
    layout: &'a ModelLayout,
    default_steps: &'a Steps,
    generating: bool,
    device: &'a Device,
}

/// Adds the requests of one text argument.
fn push_spec(
    interventions: &mut Interventions,
    context: &SpecContext<'_>,
    kind: SpecKind,
    spec: &str,
) -> Result<()> {
    let invalid = |message: String| Error::InvalidSpec {
        spec: spec.to_string(),
        message,
    };
    let (target, stored) = match (kind, spec.split_once('=')) {
        (SpecKind::Grad, _) if context.generating => {
            return Err(invalid(
                "gradients are kept on a prompt call: ask them of a trace (no \
                 --max-new-tokens)"
                    .into(),
            ));
        }
        (SpecKind::Save | SpecKind::Zero | SpecKind::Grad, None) => (spec, None),
        (SpecKind::Save | SpecKind::Zero | SpecKind::Grad, Some(_)) => {
            return Err(invalid(
                "takes no `=`; use --set or --add to write a stored tensor".into(),
            ));
        }
        (SpecKind::Add | SpecKind::Set, None) => {
            return Err(invalid(
                "expected `SITE[@STEPS]=FILE.safetensors:KEY` or `SITE[@STEPS]=NUMBER` (what to \
                 write)"
                    .into(),
            ));
        }
        (SpecKind::Add | SpecKind::Set, Some((target, source)))
            if source.trim().parse::<f32>().is_ok() =>
        {
            let value: f32 = source.trim().parse().unwrap_or(f32::NAN);
            if !value.is_finite() {
                return Err(invalid(format!(
                    "`{}` is not a finite number",
                    source.trim()
                )));
            }
            let scalar = Operand {
                values: vec![value],
                shape: Vec::new(),
            };
            return push_request(interventions, context, kind, target.trim(), Some(scalar))
                .map_err(|error| match error {
                    Error::InvalidSpec { message, .. } => invalid(message),
                    other => other,
                });
        }
        (SpecKind::Add | SpecKind::Set, Some((target, source))) => {
            let stored = StoredTensor::parse(source.trim()).map_err(invalid)?;
            if kind == SpecKind::Set && stored.scale != 1.0 {
                return Err(invalid(
                    "--set takes no `*SCALE` (use --add to scale)".into(),
                ));
            }
            (target.trim(), Some(stored))
        }
    };
    let operand = stored
        .map(|stored| stored.read())
        .transpose()?
        .map(|(values, shape)| Operand { values, shape });
    push_request(interventions, context, kind, target, operand).map_err(|error| match error {
        // Name the whole argument, not only its target.
        Error::InvalidSpec { message, .. } => invalid(message),
        other => other,
    })
}

/// Adds the requests of `kind` at the sites `target` selects, writing `operand` for sets and
/// additions.
fn push_request(
    interventions: &mut Interventions,
    context: &SpecContext<'_>,
    kind: SpecKind,
    target: &str,
    operand: Option<Operand>,
) -> Result<()> {
    let SpecContext {
        layout,
        default_steps,
        generating,
        device,
    } = *context;
    let invalid = |message: String| Error::InvalidSpec {
        spec: target.to_string(),
        message,
    };
    let selection = Selection::parse(layout, target, default_steps.clone())?;
    if !generating && !selection.steps.contains(0) {
        return Err(invalid(format!(
            "asks for step(s) {} of a single trace, which has only step 0; add \
             --max-new-tokens N to generate N more steps",
            selection.steps
        )));
    }
    for site in &selection.sites {
        let operand_shape = operand.as_ref().map(|operand| operand.shape.as_slice());
        let shape = (layout.symbolic_shape(*site)?, layout.fixed_shape(*site)?);
        precheck(shape, &selection, operand_shape)
            .map_err(|message| invalid(format!("for `{site}`: {message}")))?;
        let action = match kind {
            SpecKind::Save => Action::Save,
            SpecKind::Grad => Action::Grad,
            SpecKind::Zero => Action::Write(Write::Zero),
            SpecKind::Add | SpecKind::Set => {
                let operand = operand.as_ref().ok_or_else(|| {
                    invalid("a set or an addition needs a tensor to write".into())
                })?;
                let value = aligned_operand(operand, &selection, layout.rank(*site)?, device)
                    .map_err(|message| invalid(format!("for `{site}`: {message}")))?;
                match kind {
                    SpecKind::Add => Action::Write(Write::Add(Box::new(value))),
                    _ => Action::Write(Write::Set(Box::new(value))),
                }
            }
        };
        interventions.push_indexed(
            *site,
            selection.index.clone(),
            selection.steps.clone(),
            action,
        );
    }
    Ok(())
}

/// Checks, before any call, what the model's own sizes decide: integer indices on the axes of
/// fixed size (heads, hidden size, ...) lie within them, and the stored tensor, if any,
/// broadcasts along them. Axes that vary from call to call are checked at each call. The site's
/// shape comes as its symbolic and its fixed shape (`ModelLayout::fixed_shape`).
fn precheck(
    (symbols, fixed): (SymbolicShape, Vec<Option<usize>>),
    selection: &Selection,
    operand: Option<&[usize]>,
) -> std::result::Result<(), String> {
    // A size no index reaches, for the axes that vary: only fixed axes can fail here.
    const VARYING: usize = isize::MAX as usize / 2;
    let probe: Vec<usize> = fixed.iter().map(|d| d.unwrap_or(VARYING)).collect();
    let region = selection.index.resolve(&probe)?;
    let Some(shape) = operand else {
        return Ok(());
    };
    let aligned = selection.index.align_operand(shape, fixed.len())?;
    let kept = region.kept_shape();
    let fits = (0..fixed.len())
        .all(|axis| fixed[axis].is_none() || aligned[axis] == 1 || aligned[axis] == kept[axis]);
    if fits {
        return Ok(());
    }
    let target: Vec<String> = region
        .kept_axes()
        .map(|axis| match fixed[axis] {
            Some(_) => kept[axis].to_string(),
            None => symbols.0[axis].to_string(),
        })
        .collect();
    Err(format!(
        "the tensor of shape {shape:?} does not broadcast to the selected value's [{}]",
        target.join(", ")
    ))
}

/// The stored tensor shaped to line up with the selected part of a site of `rank` axes.
fn aligned_operand(
    operand: &Operand,
    selection: &Selection,
    rank: usize,
    device: &Device,
) -> std::result::Result<SiteValue, String> {
    let shape = &operand.shape;
    let expected: usize = shape.iter().product();
    if operand.values.len() != expected {
        return Err(format!(
            "the tensor holds {} values, not the {expected} its shape {shape:?} needs",
            operand.values.len()
        ));
    }
    let aligned = selection
        .index
        .align_operand(shape, rank)
        .map_err(|message| format!("the tensor of shape {shape:?}: {message}"))?;
    SiteValue::from_floats(operand.values.clone(), &aligned, device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_tensors_parse_with_keys_holding_colons() {
        let stored =
            StoredTensor::parse("runs/a.safetensors:layers.0.layer_output[:, -1]@0*-2.5").unwrap();
        assert_eq!(stored.file, PathBuf::from("runs/a.safetensors"));
        assert_eq!(stored.key, "layers.0.layer_output[:, -1]@0");
        assert_eq!(stored.scale, -2.5);
        assert_eq!(StoredTensor::parse("v.safetensors:k").unwrap().scale, 1.0);
        for bad in [
            "v.npy:k",
            "v.safetensors:",
            "v.safetensors:k*x",
            "v.safetensors:k*inf",
        ] {
            assert!(StoredTensor::parse(bad).is_err(), "{bad}");
        }
    }
}
