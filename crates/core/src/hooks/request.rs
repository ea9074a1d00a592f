//! What a researcher asks for: reads and writes of sites at chosen steps.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use super::index::Index;
use super::value::SiteValue;
use crate::error::{Error, Result};
use crate::schema::{CallDims, ModelLayout, Site};

/// The calls a request binds to. Step 0 is the prompt call; a request that names no steps binds
/// to step 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Steps {
    /// Exactly one step.
    At(usize),
    /// Steps `start..end` (end exclusive, like `tracer.iter[A:B]`).
    Range(Range<usize>),
    /// Every step.
    All,
}

impl Default for Steps {
    /// Step 0, the prompt call: what a read that names no steps binds to.
    fn default() -> Self {
        Steps::At(0)
    }
}

impl Steps {
    /// Whether the request applies at `step`.
    pub fn contains(&self, step: usize) -> bool {
        match self {
            Steps::At(at) => *at == step,
            Steps::Range(range) => range.contains(&step),
            Steps::All => true,
        }
    }

    /// Whether the request applies at any step of `steps`.
    pub fn overlaps(&self, steps: Range<usize>) -> bool {
        match self {
            Steps::At(at) => steps.contains(at),
            Steps::Range(range) => range.start.max(steps.start) < range.end.min(steps.end),
            Steps::All => !steps.is_empty(),
        }
    }

    /// The first step the request applies at.
    pub fn first(&self) -> usize {
        match self {
            Steps::At(step) => *step,
            Steps::Range(range) => range.start,
            Steps::All => 0,
        }
    }

    /// Parses `K`, `A:B` (end exclusive; either bound may be omitted) or `all`.
    pub fn parse(text: &str) -> Result<Steps> {
        let invalid = || Error::InvalidSteps(text.to_string());
        let number = |s: &str| s.trim().parse::<usize>().map_err(|_| invalid());
        if text.trim() == "all" {
            return Ok(Steps::All);
        }
        match text.split_once(':') {
            None => Ok(Steps::At(number(text)?)),
            Some((start, end)) => {
                let start = if start.trim().is_empty() {
                    0
                } else {
                    number(start)?
                };
                if end.trim().is_empty() {
                    return Ok(Steps::Range(start..usize::MAX));
                }
                let end = number(end)?;
                if end <= start {
                    return Err(invalid());
                }
                Ok(Steps::Range(start..end))
            }
        }
    }
}

impl fmt::Display for Steps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Steps::At(step) => write!(f, "{step}"),
            Steps::Range(range) if range.end == usize::MAX => write!(f, "{}:", range.start),
            Steps::Range(range) => write!(f, "{}:{}", range.start, range.end),
            Steps::All => f.write_str("all"),
        }
    }
}

/// Sites, part and steps named by one `PATTERN[INDEX][@STEPS]` string, such as
/// `layers.*.layer_output@1:3` or `layers.0.self_attn.attention_head_outputs[:, :, 3]@0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The matching sites, in call order.
    pub sites: Vec<Site>,
    /// The part of each site's value (numpy basic indexing; empty: all of it).
    pub index: Index,
    /// The steps.
    pub steps: Steps,
}

impl Selection {
    /// Parses `PATTERN[INDEX][@STEPS]` (the index may also follow the steps) against a model;
    /// `default_steps` applies when no `@` is given.
    pub fn parse(layout: &ModelLayout, spec: &str, default_steps: Steps) -> Result<Selection> {
        let invalid = |message: String| Error::InvalidSpec {
            spec: spec.to_string(),
            message,
        };
        let (unindexed, index) = match spec.split_once('[') {
            None => (spec.to_string(), Index::full()),
            Some((before, rest)) => {
                let (inside, after) = rest
                    .split_once(']')
                    .ok_or_else(|| invalid("the index has no closing `]`".into()))?;
                if after.contains(['[', ']']) {
                    return Err(invalid("only one `[...]` index is allowed".into()));
                }
                (
                    format!("{before}{after}"),
                    Index::parse(inside).map_err(invalid)?,
                )
            }
        };
        let (pattern, steps) = match unindexed.rsplit_once('@') {
            Some((pattern, steps)) => (pattern, Steps::parse(steps)?),
            None => (unindexed.as_str(), default_steps),
        };
        let sites = layout.expand(pattern)?;
        if !index.is_full() {
            for site in &sites {
                let rank = layout.rank(*site)?;
                index
                    .align_operand(&[], rank)
                    .map_err(|message| invalid(format!("`{site}` has {rank} axes: {message}")))?;
            }
        }
        Ok(Selection {
            sites,
            index,
            steps,
        })
    }
}

/// A user function computing a site's new value from its current one and the values of its
/// source sites at the same call (in the order the sources were named).
pub type EditFn = Arc<dyn Fn(SiteValue, &[SiteValue]) -> Result<SiteValue, String> + Send + Sync>;

/// How a write changes a site's value (or the part its request's index selects). The new value
/// flows on through the rest of the call and, through caches and state, into every later step.
#[derive(Clone)]
pub enum Write {
    /// Replace the value by this one, broadcast to its shape (numpy rules, same rank and kind).
    Set(Box<SiteValue>),
    /// Add this value, broadcast to the site's shape (steering, activation addition).
    Add(Box<SiteValue>),
    /// Replace the value by zeros.
    Zero,
    /// Replace the value by a function of it and of `sources`, values served earlier in the
    /// same call (same shape and kind).
    Edit {
        /// Sites whose values (at the same step) the edit reads.
        sources: Vec<Site>,
        /// The function.
        edit: EditFn,
    },
}

impl fmt::Debug for Write {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Write::Set(value) => write!(f, "Set({:?})", value.shape()),
            Write::Add(value) => write!(f, "Add({:?})", value.shape()),
            Write::Zero => f.write_str("Zero"),
            Write::Edit { sources, .. } => write!(f, "Edit(sources: {sources:?})"),
        }
    }
}

/// What a request does at its site.
#[derive(Debug, Clone)]
pub enum Action {
    /// Keep the value (as it flows on, after any write at the same site).
    Save,
    /// Change the value.
    Write(Write),
    /// Keep the gradient, with respect to the value as it flows on, of a scalar the caller
    /// computes from the run ([`crate::Trace::gradients`]): a prompt call on a model loaded on
    /// an autodiff device.
    Grad,
}

/// One request: a site, the part of it, the steps it binds to, and what to do there.
#[derive(Debug, Clone)]
pub struct Request {
    /// The site.
    pub site: Site,
    /// The part of the site's value read or written (empty: all of it).
    pub index: Index,
    /// The steps it applies at.
    pub steps: Steps,
    /// Read or write.
    pub action: Action,
}

/// Every request of one trace or generation, in the order they were made (writes at one site
/// apply in that order).
#[derive(Debug, Clone, Default)]
pub struct Interventions {
    requests: Vec<Request>,
}

impl Interventions {
    /// No requests: the forward pass runs unhooked.
    pub fn new() -> Self {
        Self::default()
    }

    /// Saves `site` at `steps`.
    pub fn save(mut self, site: Site, steps: Steps) -> Self {
        self.push(site, steps, Action::Save);
        self
    }

    /// Replaces `site` by `value` at `steps`.
    pub fn set(mut self, site: Site, steps: Steps, value: SiteValue) -> Self {
        self.push(site, steps, Action::Write(Write::Set(Box::new(value))));
        self
    }

    /// Adds `value` (broadcast to the site's shape) to `site` at `steps`.
    pub fn add(mut self, site: Site, steps: Steps, value: SiteValue) -> Self {
        self.push(site, steps, Action::Write(Write::Add(Box::new(value))));
        self
    }

    /// Keeps the gradient at `site` of the prompt call (see [`Action::Grad`]).
    pub fn grad(mut self, site: Site) -> Self {
        self.push(site, Steps::At(0), Action::Grad);
        self
    }

    /// Whether a request asks for a gradient.
    pub fn has_gradients(&self) -> bool {
        self.requests
            .iter()
            .any(|request| matches!(request.action, Action::Grad))
    }

    /// Zeroes `site` at `steps`.
    pub fn zero(mut self, site: Site, steps: Steps) -> Self {
        self.push(site, steps, Action::Write(Write::Zero));
        self
    }

    /// Replaces `site` by `edit(value)` at `steps`.
    pub fn edit(
        self,
        site: Site,
        steps: Steps,
        edit: impl Fn(SiteValue) -> Result<SiteValue, String> + Send + Sync + 'static,
    ) -> Self {
        self.edit_with(site, steps, Vec::new(), move |value, _| edit(value))
    }

    /// Replaces `site` by `edit(value, sources)` at `steps`, where `sources` are the values of
    /// the named sites in the same call. Every source must occur before `site` in the call
    /// order; [`Interventions::validate`] rejects one that does not.
    pub fn edit_with(
        mut self,
        site: Site,
        steps: Steps,
        sources: Vec<Site>,
        edit: impl Fn(SiteValue, &[SiteValue]) -> Result<SiteValue, String> + Send + Sync + 'static,
    ) -> Self {
        let edit: EditFn = Arc::new(edit);
        self.push(site, steps, Action::Write(Write::Edit { sources, edit }));
        self
    }

    /// Adds a request on the whole value of `site`.
    pub fn push(&mut self, site: Site, steps: Steps, action: Action) {
        self.push_indexed(site, Index::full(), steps, action);
    }

    /// Adds a request on the part `index` selects of `site`'s value: a save keeps that part
    /// (numpy-shaped), a write changes only it (a set or add broadcasting to its shape).
    pub fn push_indexed(&mut self, site: Site, index: Index, steps: Steps, action: Action) {
        self.requests.push(Request {
            site,
            index,
            steps,
            action,
        });
    }

    /// The requests, in order.
    pub fn requests(&self) -> &[Request] {
        &self.requests
    }

    /// Bytes the values saved (and gradients kept) by a run of `steps` calls on `batch` prompts
    /// of `prompt_len` tokens will take at most (every value counted as 4-byte elements, 8 for `input_ids`),
    /// from the schema's shape table; `Ok(None)` if the count overflows. A generation that stops
    /// early at EOS saves less. A saved site this model does not serve is an error naming it.
    pub fn saved_bytes(
        &self,
        layout: &ModelLayout,
        sizes: (usize, usize),
        steps: usize,
    ) -> Result<Option<usize>> {
        let mut total = Some(0u128);
        for request in self
            .requests
            .iter()
            .filter(|r| matches!(r.action, Action::Save | Action::Grad))
        {
            let bytes = saved_bytes_of(layout, request, sizes, steps)?;
            total = total
                .zip(bytes)
                .and_then(|(total, bytes)| total.checked_add(bytes));
        }
        Ok(total.and_then(|total| usize::try_from(total).ok()))
    }

    /// Whether every prompt of a batch is read and written alone, so that a run of several
    /// requests' prompts stacked in one batch gives each the rows it would get alone: every
    /// request keeps the batch axis whole ([`Index::keeps_first_axis`]), and every write is a
    /// zero or a set or add of a value with one row (broadcast over the batch). An edit
    /// function may mix rows, so it is not.
    pub fn rows_independent(&self) -> bool {
        self.requests.iter().all(|request| {
            request.index.keeps_first_axis()
                && match &request.action {
                    Action::Save | Action::Grad | Action::Write(Write::Zero) => true,
                    Action::Write(Write::Set(value) | Write::Add(value)) => {
                        value.shape().first() == Some(&1)
                    }
                    Action::Write(Write::Edit { .. }) => false,
                }
        })
    }

    /// Whether nothing is requested.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Checks, before anything runs, that every requested site exists on this model and that
    /// no edit needs a value occurring later in the same call than the site it edits.
    pub fn validate(&self, layout: &ModelLayout) -> Result<()> {
        let order = layout.call_order();
        let position = |site: &Site| order.iter().position(|s| s == site);
        for request in &self.requests {
            layout.resolve(&request.site.to_string())?;
            let Action::Write(Write::Edit { sources, .. }) = &request.action else {
                continue;
            };
            for source in sources {
                layout.resolve(&source.to_string())?;
                let (Some(edited), Some(needed)) = (position(&request.site), position(source))
                else {
                    continue;
                };
                if needed >= edited {
                    return Err(Error::OutOfOrder {
                        site: request.site.to_string(),
                        site_position: edited,
                        needed: source.to_string(),
                        needed_position: needed,
                    });
                }
            }
        }
        Ok(())
    }

    /// The sites some edit at `step` reads as a source.
    pub(crate) fn sources_at(&self, step: usize) -> impl Iterator<Item = Site> + '_ {
        self.requests
            .iter()
            .filter(move |request| request.steps.contains(step))
            .filter_map(|request| match &request.action {
                Action::Write(Write::Edit { sources, .. }) => Some(sources.iter().copied()),
                _ => None,
            })
            .flatten()
    }
}

/// Bytes one save request keeps over a run of `steps` calls on `batch` prompts of `prompt_len`
/// tokens (as [`Interventions::saved_bytes`] counts them); `Ok(None)` if the count overflows.
fn saved_bytes_of(
    layout: &ModelLayout,
    request: &Request,
    (batch, prompt_len): (usize, usize),
    steps: usize,
) -> Result<Option<u128>> {
    let end = match &request.steps {
        Steps::At(step) => step.checked_add(1),
        Steps::Range(range) => Some(range.end),
        Steps::All => Some(steps),
    };
    let Some(end) = end.map(|end| end.min(steps)) else {
        return Ok(None);
    };
    let start = request.steps.first();
    if start >= end {
        return Ok(Some(0));
    }
    let element: u128 = if request.site == Site::InputIds { 8 } else { 4 };
    let bytes_at = |step: usize| -> Result<Option<u128>> {
        let Some(positions) = prompt_len.checked_add(step) else {
            return Ok(None);
        };
        let dims = CallDims {
            batch,
            tokens: if step == 0 { prompt_len } else { 1 },
            positions,
        };
        let shape = layout.shape(request.site, dims)?;
        Ok(shape
            .iter()
            .try_fold(element, |n, &d| n.checked_mul(d as u128)))
    };
    let prompt = if start == 0 { bytes_at(0)? } else { Some(0) };
    // Decode steps differ only in the cache length, so their sizes grow linearly with the step:
    // the sum over the range is its count times the mean of its ends.
    let (first, last) = (start.max(1), end - 1);
    let decode = if first <= last {
        let count = (last - first + 1) as u128;
        let ends = bytes_at(first)?.zip(bytes_at(last)?);
        ends.and_then(|(first, last)| first.checked_add(last))
            .and_then(|ends| count.checked_mul(ends))
            .map(|sum| sum / 2)
    } else {
        Some(0)
    };
    Ok(prompt
        .zip(decode)
        .and_then(|(prompt, decode)| prompt.checked_add(decode)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_carry_their_steps() {
        let layout = crate::schema::tests::gpt2_like(2);
        let selection =
            Selection::parse(&layout, "layers.*.layer_output@1:3", Steps::At(0)).unwrap();
        assert_eq!(selection.sites.len(), 2);
        assert_eq!(selection.steps, Steps::Range(1..3));
        let selection = Selection::parse(&layout, "logits", Steps::All).unwrap();
        assert_eq!(selection.sites, [Site::Logits]);
        assert_eq!(selection.steps, Steps::All);
        assert!(Selection::parse(&layout, "logits@x", Steps::All).is_err());
    }

    #[test]
    fn steps_parse_and_bind() {
        assert_eq!(Steps::parse("3").unwrap(), Steps::At(3));
        assert_eq!(Steps::parse("1:3").unwrap(), Steps::Range(1..3));
        assert_eq!(Steps::parse("all").unwrap(), Steps::All);
        let open = Steps::parse("2:").unwrap();
        assert!(!open.contains(1) && open.contains(2) && open.contains(50));
        let range = Steps::parse("1:3").unwrap();
        assert!(!range.contains(0) && range.contains(1) && range.contains(2) && !range.contains(3));
        for bad in ["", "x", "3:1", "2:2", "-1", "1:2:3"] {
            assert!(Steps::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn steps_overlap_ranges_of_steps() {
        assert!(Steps::At(3).overlaps(2..4) && !Steps::At(4).overlaps(2..4));
        assert!(Steps::Range(1..3).overlaps(2..usize::MAX));
        assert!(!Steps::Range(1..3).overlaps(3..9));
        assert!(Steps::All.overlaps(5..6) && !Steps::All.overlaps(5..5));
    }
}
