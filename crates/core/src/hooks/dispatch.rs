//! The hook entry the forward pass calls at every site, for one call (one step).

use std::collections::HashMap;

use super::request::{Action, Interventions, Write};
use super::value::{SiteTensor, SiteValue};
use crate::error::{Error, Result};
use crate::schema::{ModelLayout, Site};

/// Told of every site a call serves, in the order it is served: for tools that watch the forward
/// pass (the conformance suite checks the step-order contract with one). Observing changes
/// nothing: not the values, and not which computation path an adapter takes.
pub trait Observer {
    /// `site` was served at `step`.
    fn served(&mut self, step: usize, site: Site);
}

/// Values saved by reads, keyed by site and step.
#[derive(Debug, Clone, Default)]
pub struct Saved {
    values: HashMap<(Site, usize), SiteValue>,
}

impl Saved {
    /// The value of `site` at `step`, if it was saved.
    pub fn get(&self, site: Site, step: usize) -> Option<&SiteValue> {
        self.values.get(&(site, step))
    }

    /// Every saved value, ordered by step, then by site.
    pub fn iter(&self) -> impl Iterator<Item = (Site, usize, &SiteValue)> {
        let mut keys: Vec<&(Site, usize)> = self.values.keys().collect();
        keys.sort_by_key(|(site, step)| (*step, *site));
        keys.into_iter()
            .map(|key| (key.0, key.1, &self.values[key]))
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
    save: bool,
    /// Some edit of this call reads this site's value.
    capture: bool,
    writes: Vec<&'a Write>,
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

/// The hooks of one forward call. Adapters call [`Hooks::visit`] at every site, in the order of
/// the step-order contract; nothing else of hooking is their business.
///
/// A site with no request costs one indexed lookup: no copy, no allocation.
pub(crate) struct Hooks<'a> {
    step: usize,
    layout: &'a ModelLayout,
    /// Indexed by [`ModelLayout::slot`]; empty when nothing applies at this step.
    plans: Vec<Option<SitePlan<'a>>>,
    saved: &'a mut Saved,
    /// Values of this call's edit sources, by slot.
    captured: HashMap<usize, SiteValue>,
    observer: Option<&'a mut dyn Observer>,
    /// The slot after whose visit the call ends ([`Error::StoppedEarly`]).
    stop_after: Option<usize>,
}

impl<'a> Hooks<'a> {
    /// The hooks for call `step` of a run with these interventions; `observer`, if any, is told
    /// of every site served.
    pub fn for_call(
        layout: &'a ModelLayout,
        interventions: &'a Interventions,
        step: usize,
        saved: &'a mut Saved,
        observer: Option<&'a mut dyn Observer>,
    ) -> Self {
        let mut plans: Vec<Option<SitePlan<'a>>> = Vec::new();
        for request in interventions.requests() {
            if !request.steps.contains(step) || !layout.has(request.site) {
                continue;
            }
            let plan = plan_of(&mut plans, layout, request.site);
            match &request.action {
                Action::Save => plan.save = true,
                Action::Write(write) => plan.writes.push(write),
            }
        }
        for source in interventions.sources_at(step) {
            if layout.has(source) {
                plan_of(&mut plans, layout, source).capture = true;
            }
        }
        Hooks {
            step,
            layout,
            plans,
            saved,
            captured: HashMap::new(),
            observer,
            stop_after: None,
        }
    }

    /// Makes the call end, with [`Error::StoppedEarly`], right after the last site (in call
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
        for write in &plan.writes {
            value = self.apply_write(site, write, value)?;
        }
        if plan.save {
            self.saved
                .values
                .insert((site, self.step), value.clone().into_value());
        }
        if plan.capture {
            self.captured.insert(slot, value.clone().into_value());
        }
        if self.stop_after == Some(slot) {
            return Err(Error::StoppedEarly);
        }
        Ok(value)
    }

    fn apply_write<T: SiteTensor>(&self, site: Site, write: &Write, value: T) -> Result<T> {
        let current = value.into_value();
        let expected = current.shape();
        let replacement = match write {
            Write::Zero => current.zeros_like(),
            Write::Set(new) => SiteValue::clone(new),
            Write::Edit { sources, edit } => {
                let inputs = sources
                    .iter()
                    .map(|source| {
                        self.captured
                            .get(&self.layout.slot(*source))
                            .cloned()
                            .ok_or_else(|| Error::Edit {
                                site: site.to_string(),
                                message: format!("source `{source}` was not served before it"),
                            })
                    })
                    .collect::<Result<Vec<_>>>()?;
                edit(current, &inputs).map_err(|message| Error::Edit {
                    site: site.to_string(),
                    message,
                })?
            }
        };
        let got = replacement.shape();
        let kind = replacement.describe();
        let replacement = T::from_value(replacement).ok_or_else(|| Error::WriteKindMismatch {
            site: site.to_string(),
            expected: T::describe().to_string(),
            got: kind,
        })?;
        if got != expected {
            return Err(Error::WriteShapeMismatch {
                site: site.to_string(),
                step: self.step,
                expected,
                got,
            });
        }
        Ok(replacement)
    }
}
