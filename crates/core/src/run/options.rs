//! [`Run`]: what a trace or a generation does around the forward pass.

use crate::hooks::{Interventions, Observer};

/// The options of one run, for [`crate::Model::trace`] (one forward call) and
/// [`crate::Model::generate`] (one call per token) alike: the reads and writes to make and what
/// else the run should do, set one method at a time. Interventions alone convert into a run, so
/// the common case needs no builder:
///
/// ```text
/// model.trace(&batch, &requests)?;
/// model.trace(&batch, Run::new().interventions(&requests).observer(&mut recorder))?;
/// let saved = model.trace(&batch, Run::new().interventions(&requests).stop_after_last_request())?.saved;
/// model.generate(&batch, Run::new().interrupt_when(&mut |_| stop.load(Relaxed)), &config)?;
/// ```
#[derive(Default)]
#[must_use]
pub struct Run<'a> {
    pub(super) interventions: Option<&'a Interventions>,
    pub(super) observer: Option<&'a mut dyn Observer>,
    pub(super) stop_after_last_request: bool,
    pub(super) interrupt: Option<&'a mut dyn FnMut(usize) -> bool>,
}

impl<'a> Run<'a> {
    /// A plain run: no reads or writes, no observer, every call to its end.
    pub fn new() -> Self {
        Run::default()
    }

    /// Makes the reads and writes of `interventions`, at the steps each names.
    pub fn interventions(mut self, interventions: &'a Interventions) -> Self {
        self.interventions = Some(interventions);
        self
    }

    /// Tells `observer` of every site each call serves, in order (observing changes nothing).
    pub fn observer(mut self, observer: &'a mut dyn Observer) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Ends the call right after the last site a request reads or writes: the layers after it
    /// and the language-model head are never computed, and the [`crate::Trace`] holds the saved
    /// values only (nnsight's `tracer.stop()`; what dataset extraction needs). For a trace only:
    /// a generation needs every step's distribution.
    pub fn stop_after_last_request(mut self) -> Self {
        self.stop_after_last_request = true;
        self
    }

    /// Asks `interrupted(step)` before every call; `true` ends the run with
    /// [`crate::Error::Interrupted`] (how a notebook's Ctrl-C stops a long generation).
    pub fn interrupt_when(mut self, interrupted: &'a mut dyn FnMut(usize) -> bool) -> Self {
        self.interrupt = Some(interrupted);
        self
    }
}

impl<'a> From<&'a Interventions> for Run<'a> {
    /// A run making these reads and writes, with no other option.
    fn from(interventions: &'a Interventions) -> Self {
        Run::new().interventions(interventions)
    }
}

impl std::fmt::Debug for Run<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("interventions", &self.interventions)
            .field("observed", &self.observer.is_some())
            .field("stop_after_last_request", &self.stop_after_last_request)
            .field("interruptible", &self.interrupt.is_some())
            .finish()
    }
}
