//! The hook entry the forward pass calls at every site, for one call (one step).

mod dictionary;

use std::collections::HashMap;
use std::ops::Range;

use burn::tensor::{Slice, Tensor, TensorData};

use super::dictionary::Attachment;
use super::index::{Index, Region};
use super::request::{Action, Interventions, Write};
use super::value::{SiteTensor, SiteValue};
use crate::error::{Error, Result, StopSignal};
use crate::schema::{ModelLayout, Site};

/// Told of every site a call serves, in the order it is served: for tools that watch the forward
/// pass (the conformance suite checks the step-order contract with one). Observing changes
/// nothing: not the values, and not which computation path an adapter takes.
pub trait Observer: Send {
    /// `site` was served at `step`.
    fn served(&mut self, step: usize, site: Site);
}

/// Values saved by reads, keyed by site, index and step; and, for a run asking gradients, the
/// leaves that collect them.
#[derive(Debug, Clone, Default)]
pub struct Saved {
    values: HashMap<(Site, Index, usize), SavedPart>,
    /// Per site and step asked a gradient, the zero leaf added to its value.
    leaves: HashMap<(Site, usize), SiteValue>,
    /// The gradients asked, by site, part and step, in request order.
    gradient_parts: Vec<(Site, Index, usize)>,
}

/// One saved value and its numpy shape (the value keeps a length-1 axis where an integer
/// index dropped one).
#[derive(Debug, Clone)]
struct SavedPart {
    value: SiteValue,
    shape: Vec<usize>,
}

/// One entry of [`Saved`].
#[derive(Debug, Clone, Copy)]
pub struct SavedEntry<'a> {
    /// The site.
    pub site: Site,
    /// The part of it that was saved (empty: all of it).
    pub index: &'a Index,
    /// The step.
    pub step: usize,
    /// The value; under an integer index it keeps that axis with length 1 (see
    /// [`SavedEntry::shape`]).
    pub value: &'a SiteValue,
    shape: &'a [usize],
}

impl SavedEntry<'_> {
    /// `site[index]@step`, the name the value is written under.
    pub fn key(&self) -> String {
        format!("{}{}@{}", self.site, self.index, self.step)
    }

    /// The value's shape as numpy indexing gives it (integer-indexed axes dropped).
    pub fn shape(&self) -> &[usize] {
        self.shape
    }

    /// The value in host memory, in its numpy shape.
    pub fn to_data(&self) -> TensorData {
        let (bytes, _, dtype) = self.value.to_data().into_parts();
        TensorData::from_bytes(bytes, self.shape.to_vec(), dtype)
    }
}

impl Saved {
    /// The whole value of `site` at `step`, if it was saved.
    pub fn get(&self, site: Site, step: usize) -> Option<&SiteValue> {
        self.get_indexed(site, &Index::full(), step)
    }

    /// The whole value of `site` at `step`, which the run was asked to save: an error naming
    /// them if it was not served.
    pub fn require(&self, site: Site, step: usize) -> Result<&SiteValue> {
        self.get(site, step).ok_or_else(|| Error::NotServed {
            site: site.to_string(),
            step,
        })
    }

    /// The part `index` of `site` at `step`, if it was saved (keeping integer-indexed axes with
    /// length 1).
    pub fn get_indexed(&self, site: Site, index: &Index, step: usize) -> Option<&SiteValue> {
        self.values
            .get(&(site, index.clone(), step))
            .map(|part| &part.value)
    }

    /// Every saved value, ordered by step, then by site, then by index.
    pub fn iter(&self) -> impl Iterator<Item = SavedEntry<'_>> {
        let mut keys: Vec<&(Site, Index, usize)> = self.values.keys().collect();
        keys.sort_by_key(|(site, index, step)| (*step, *site, index.to_string()));
        keys.into_iter().map(|key| {
            let part = &self.values[key];
            SavedEntry {
                site: key.0,
                index: &key.1,
                step: key.2,
                value: &part.value,
                shape: &part.shape,
            }
        })
    }

    /// The values of batch rows `rows` alone: every value sliced along its first axis, which
    /// must be the batch of `batch_size` rows (see [`crate::Interventions::rows_independent`]);
    /// an error naming the value where it is not.
    pub fn rows(&self, rows: Range<usize>, batch_size: usize) -> Result<Saved> {
        let mut values = HashMap::with_capacity(self.values.len());
        for ((site, index, step), part) in &self.values {
            let whole = part.value.shape();
            if whole.first() != Some(&batch_size)
                || part.shape.first() != Some(&batch_size)
                || rows.end > batch_size
            {
                return Err(Error::InvalidInput(format!(
                    "`{site}{index}@{step}` ({:?}) has no batch axis of {batch_size} rows to take \
                     rows {rows:?} from",
                    part.shape
                )));
            }
            let mut slices = vec![Slice::from(..); whole.len()];
            slices[0] = Slice::from(rows.clone());
            let mut shape = part.shape.clone();
            shape[0] = rows.len();
            let part = SavedPart {
                value: part.value.slice(&slices),
                shape,
            };
            values.insert((*site, index.clone(), *step), part);
        }
        Ok(Saved {
            values,
            ..Saved::default()
        })
    }

    /// The gradients of `metric` (a scalar computed from this run's values, e.g. its logits)
    /// with respect to every site part the run asked a gradient of ([`Action::Grad`]), keyed
    /// as the values are; zero where the metric does not depend on a site. The backward pass
    /// consumes the run's graph: a second call is an error.
    pub fn gradients(&mut self, metric: &Tensor<1>) -> Result<Saved> {
        if self.gradient_parts.is_empty() {
            return Err(Error::InvalidInput(
                "the run asked no gradient (a `Grad` request, `--save-grad`)".into(),
            ));
        }
        if self.leaves.is_empty() {
            return Err(Error::InvalidInput(
                "this run's gradients were taken already: the backward pass consumes its graph"
                    .into(),
            ));
        }
        if metric.dims() != [1] || !metric.is_tracked() {
            return Err(Error::InvalidInput(format!(
                "the metric must be one number computed from the run's values (shape {:?}, {})",
                metric.dims(),
                match metric.is_tracked() {
                    true => "tracked",
                    false => "not tracked: it depends on no site asked a gradient",
                }
            )));
        }
        let leaves = std::mem::take(&mut self.leaves);
        let gradients = metric.backward();
        let mut values = HashMap::with_capacity(self.gradient_parts.len());
        for (site, index, step) in &self.gradient_parts {
            let leaf = &leaves[&(*site, *step)];
            let whole = leaf
                .gradient(&gradients)
                .unwrap_or_else(|| leaf.zeros_like().without_autodiff());
            let (value, shape) = match index.is_full() {
                true => {
                    let shape = whole.shape();
                    (whole, shape)
                }
                false => {
                    let region = index
                        .resolve(&whole.shape())
                        .map_err(|message| Error::Index {
                            site: format!("{site}{index}"),
                            step: *step,
                            message,
                        })?;
                    (region.read(&whole), region.shape())
                }
            };
            values.insert((*site, index.clone(), *step), SavedPart { value, shape });
        }
        Ok(Saved {
            values,
            ..Saved::default()
        })
    }

    /// Number of saved values.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether nothing was saved.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// What to do at one site during this call.
#[derive(Default)]
struct SitePlan<'a> {
    /// The parts to save (the full index for the whole value).
    saves: Vec<&'a Index>,
    /// Some edit of this call reads this site's value.
    capture: bool,
    /// The writes, in request order, each on the part its index selects.
    writes: Vec<(&'a Index, &'a Write)>,
    /// The dictionary attached here runs (some request of this call reads or writes one of
    /// its values, or it replaces the site by its reconstruction).
    dictionary: bool,
    /// The parts whose gradient to keep.
    grads: Vec<&'a Index>,
}

/// The plan of `site`, creating the (dense) table on first use.
fn plan_of<'p, 'a>(
    plans: &'p mut Vec<Option<SitePlan<'a>>>,
    layout: &ModelLayout,
    site: Site,
) -> &'p mut SitePlan<'a> {
    if plans.is_empty() {
        plans.resize_with(layout.slot_count(), || None);
    }
    plans[layout.slot(site)].get_or_insert_with(SitePlan::default)
}

/// What the hooks of a call see of the model: its sites and its attached dictionaries (in the
/// order of `layout.dictionaries`).
#[derive(Clone, Copy)]
pub(crate) struct ModelView<'a> {
    /// The sites.
    pub layout: &'a ModelLayout,
    /// The attached dictionaries.
    pub dictionaries: &'a [Attachment],
}

/// The hooks of one forward call. Adapters call [`Hooks::visit`] at every site, in the order of
/// the step-order contract; nothing else of hooking is their business.
///
/// A site with no request costs one indexed lookup: no copy, no allocation.
pub(crate) struct Hooks<'a> {
    step: usize,
    layout: &'a ModelLayout,
    /// The attached dictionaries, in the order of `layout.dictionaries`.
    dictionaries: &'a [Attachment],
    /// Indexed by [`ModelLayout::slot`]; empty when nothing applies at this step.
    plans: Vec<Option<SitePlan<'a>>>,
    saved: &'a mut Saved,
    /// Values of this call's edit sources, by slot.
    captured: HashMap<usize, SiteValue>,
    observer: Option<&'a mut dyn Observer>,
    /// The slot after whose visit the call ends ([`StopSignal`]).
    stop_after: Option<usize>,
}

impl<'a> Hooks<'a> {
    /// The hooks for call `step` of a run with these interventions on `model`; `observer`, if
    /// any, is told of every site served.
    pub fn for_call(
        model: ModelView<'a>,
        interventions: &'a Interventions,
        step: usize,
        saved: &'a mut Saved,
        observer: Option<&'a mut dyn Observer>,
    ) -> Self {
        let ModelView {
            layout,
            dictionaries,
        } = model;
        let mut plans: Vec<Option<SitePlan<'a>>> = Vec::new();
        for request in interventions.requests() {
            if !request.steps.contains(step) || !layout.has(request.site) {
                continue;
            }
            let plan = plan_of(&mut plans, layout, request.site);
            match &request.action {
                Action::Save => plan.saves.push(&request.index),
                Action::Write(write) => plan.writes.push((&request.index, write)),
                Action::Grad => plan.grads.push(&request.index),
            }
            if let Site::Dictionary { .. } = request.site {
                plan_of(&mut plans, layout, request.site.dictionary_host()).dictionary = true;
            }
        }
        for source in interventions.sources_at(step) {
            if layout.has(source) {
                plan_of(&mut plans, layout, source).capture = true;
            }
        }
        for (placement, attachment) in layout.dictionaries.iter().zip(dictionaries) {
            if !attachment.error_term {
                plan_of(&mut plans, layout, placement.site).dictionary = true;
            }
            let runs = plans
                .get(layout.slot(placement.site))
                .and_then(Option::as_ref)
                .is_some_and(|plan| plan.dictionary);
            if runs && placement.input != placement.site {
                plan_of(&mut plans, layout, placement.input).capture = true;
            }
        }
        Hooks {
            step,
            layout,
            dictionaries,
            plans,
            saved,
            captured: HashMap::new(),
            observer,
            stop_after: None,
        }
    }

    /// Makes the call end, with the engine's [`StopSignal`], right after the last site (in call
    /// order) that a request of this call reads or writes.
    pub fn stop_after_last_request(&mut self) {
        self.stop_after = self
            .layout
            .call_order()
            .into_iter()
            .map(|site| self.layout.slot(site))
            .rfind(|slot| self.plans.get(*slot).is_some_and(Option::is_some));
    }

    /// Whether any request reads or writes `site` in this call. Adapters use it to skip
    /// computing a value nobody looks at (e.g. explicit attention probabilities); an
    /// [`Observer`] does not count.
    pub fn observes(&self, site: Site) -> bool {
        self.plan(site).is_some()
    }

    /// Whether any request writes `site` in this call.
    pub fn writes(&self, site: Site) -> bool {
        self.plan(site).is_some_and(|plan| !plan.writes.is_empty())
    }

    fn plan(&self, site: Site) -> Option<&SitePlan<'a>> {
        self.plans
            .get(self.layout.slot(site))
            .and_then(Option::as_ref)
    }

    /// The hook entry: applies this call's writes to `site` in request order, saves the result
    /// if asked, and returns the value that flows on.
    pub fn visit<T: SiteTensor>(&mut self, site: Site, value: T) -> Result<T> {
        if let Some(observer) = self.observer.as_deref_mut() {
            observer.served(self.step, site);
        }
        let slot = self.layout.slot(site);
        let Some(plan) = self.plans.get(slot).and_then(Option::as_ref) else {
            return Ok(value);
        };
        let mut value = value;
        for (index, write) in &plan.writes {
            value = self.apply_write(site, index, write, value)?;
        }
        if plan.dictionary {
            value = self.run_dictionary(site, value)?;
        }
        let Some(plan) = self.plans.get(slot).and_then(Option::as_ref) else {
            return Ok(value);
        };
        if !plan.grads.is_empty() {
            value = self.add_gradient_leaf(site, value)?;
        }
        let Some(plan) = self.plans.get(slot).and_then(Option::as_ref) else {
            return Ok(value);
        };
        for index in &plan.saves {
            let whole = value.clone().into_value();
            let (part, shape) = if index.is_full() {
                let shape = whole.shape();
                (whole, shape)
            } else {
                let region = self.region(site, index, &whole)?;
                (region.read(&whole), region.shape())
            };
            let key = (site, (*index).clone(), self.step);
            self.saved
                .values
                .insert(key, SavedPart { value: part, shape });
        }
        if plan.capture {
            self.captured.insert(slot, value.clone().into_value());
        }
        if self.stop_after == Some(slot) {
            return Err(StopSignal::raise());
        }
        Ok(value)
    }

    /// `value` plus a zero leaf that keeps its gradient: the value flows on unchanged and
    /// tracked, and the backward pass leaves the gradient with respect to it on the leaf
    /// ([`Saved::gradients`]).
    fn add_gradient_leaf<T: SiteTensor>(&mut self, site: Site, value: T) -> Result<T> {
        let whole = value.into_value();
        let leaf = whole.gradient_leaf().map_err(|message| Error::Edit {
            site: site.to_string(),
            message,
        })?;
        let tracked = whole.plus(leaf.clone()).map_err(|message| Error::Edit {
            site: site.to_string(),
            message,
        })?;
        let slot = self.layout.slot(site);
        if let Some(plan) = self.plans.get(slot).and_then(Option::as_ref) {
            for index in &plan.grads {
                self.saved
                    .gradient_parts
                    .push((site, (*index).clone(), self.step));
            }
        }
        self.saved.leaves.insert((site, self.step), leaf);
        T::from_value(tracked).ok_or_else(|| Error::Edit {
            site: site.to_string(),
            message: "the value changed kind".into(),
        })
    }

    /// The part of `value` (the value of `site`) that `index` selects at this step.
    fn region(&self, site: Site, index: &Index, value: &SiteValue) -> Result<Region> {
        index
            .resolve(&value.shape())
            .map_err(|message| Error::Index {
                site: format!("{site}{index}"),
                step: self.step,
                message,
            })
    }

    /// Applies one write to the part `index` selects of `site`'s value.
    fn apply_write<T: SiteTensor>(
        &self,
        site: Site,
        index: &Index,
        write: &Write,
        value: T,
    ) -> Result<T> {
        let whole = value.into_value();
        let region = match index.is_full() {
            true => None,
            false => Some(self.region(site, index, &whole)?),
        };
        let kind_error = |got: String| Error::WriteKindMismatch {
            site: format!("{site}{index}"),
            expected: T::describe().to_string(),
            got,
        };
        if region.as_ref().is_some_and(Region::is_empty) {
            return T::from_value(whole).ok_or_else(|| kind_error("another kind".into()));
        }
        let part = match &region {
            None => whole.clone(),
            Some(region) => region.read(&whole),
        };
        let label = || format!("{site}{index}");
        let expected = part.shape();
        let written = match write {
            Write::Zero => part.zeros_like(),
            Write::Set(new) | Write::Add(new) => {
                if std::mem::discriminant(new.as_ref()) != std::mem::discriminant(&part) {
                    return Err(kind_error(new.describe()));
                }
                let operand =
                    new.broadcast_to(&expected)
                        .ok_or_else(|| Error::WriteShapeMismatch {
                            site: label(),
                            step: self.step,
                            expected: expected.clone(),
                            got: new.shape(),
                        })?;
                match write {
                    Write::Add(_) => part.plus(operand).map_err(|message| Error::Edit {
                        site: label(),
                        message,
                    })?,
                    _ => operand,
                }
            }
            Write::Edit { sources, edit } => {
                let inputs = sources
                    .iter()
                    .map(|source| {
                        self.captured
                            .get(&self.layout.slot(*source))
                            .cloned()
                            .ok_or_else(|| Error::Edit {
                                site: label(),
                                message: format!("source `{source}` was not served before it"),
                            })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let edited = edit(part, &inputs).map_err(|message| Error::Edit {
                    site: label(),
                    message,
                })?;
                if std::mem::discriminant(&edited) != std::mem::discriminant(&whole) {
                    return Err(kind_error(edited.describe()));
                }
                if edited.shape() != expected {
                    return Err(Error::WriteShapeMismatch {
                        site: label(),
                        step: self.step,
                        expected,
                        got: edited.shape(),
                    });
                }
                edited
            }
        };
        let result = match &region {
            None => written,
            Some(region) => region
                .write(whole, written)
                .map_err(|message| Error::Edit {
                    site: label(),
                    message,
                })?,
        };
        T::from_value(result).ok_or_else(|| kind_error("another kind".into()))
    }
}
