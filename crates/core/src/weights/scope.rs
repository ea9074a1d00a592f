//! Scoped weight names, after candle's `VarBuilder::pp`: a [`WeightScope`] is a view of the
//! [`WeightLoader`] under a dotted prefix (`model.layers.3`), so that an adapter asks for
//! `self_attn.q_proj` where the checkpoint stores `model.layers.3.self_attn.q_proj`. Every
//! weight is still read, and every problem still reported, under its full key.

use std::fmt::Display;

use burn::tensor::Tensor;

use super::WeightLoader;
use crate::error::{Error, Result};

/// A view of a [`WeightLoader`] whose names are relative to a prefix.
pub struct WeightScope<'l, 'a> {
    loader: &'l mut WeightLoader<'a>,
    prefix: String,
}

/// `prefix.name`, or whichever of the two is not empty.
fn join(prefix: &str, name: &str) -> String {
    match (prefix.is_empty(), name.is_empty()) {
        (true, _) => name.to_string(),
        (_, true) => prefix.to_string(),
        _ => format!("{prefix}.{name}"),
    }
}

impl<'a> WeightLoader<'a> {
    /// The weights under `name` (`model`; `""` for the root).
    pub fn pp(&mut self, name: impl Display) -> WeightScope<'_, 'a> {
        WeightScope {
            prefix: name.to_string(),
            loader: self,
        }
    }

    /// The weights under the one of `candidates` (`["transformer", ""]`) that this checkpoint
    /// stores them under, as [`WeightLoader::prefix`] decides.
    pub fn pp_stored(&mut self, candidates: &[&str]) -> WeightScope<'_, 'a> {
        let dotted: Vec<String> = candidates.iter().map(|c| format!("{c}.")).collect();
        let dotted: Vec<&str> = dotted
            .iter()
            .map(|c| if c == "." { "" } else { c })
            .collect();
        let chosen = self.prefix(&dotted).trim_end_matches('.').to_string();
        self.pp(chosen)
    }
}

impl<'a> WeightScope<'_, 'a> {
    /// The weights under `name` within this scope (`layers.3`).
    pub fn pp(&mut self, name: impl Display) -> WeightScope<'_, 'a> {
        WeightScope {
            prefix: join(&self.prefix, &name.to_string()),
            loader: self.loader,
        }
    }

    /// The full key of `name` within this scope (`""`: the scope's own name).
    pub fn key(&self, name: &str) -> String {
        join(&self.prefix, name)
    }

    /// The weight `name` within this scope, as [`WeightLoader::tensor`] reads it.
    pub fn tensor<const D: usize>(&mut self, name: &str, shape: [usize; D]) -> Result<Tensor<D>> {
        let key = self.key(name);
        self.loader.tensor(&key, shape)
    }

    /// Whether the weight `name` within this scope is available.
    pub fn contains(&self, name: &str) -> bool {
        self.loader.contains(&self.key(name))
    }

    /// Records a problem about this scope's weights, named by the scope's full key (see
    /// [`WeightLoader::problem`]).
    pub fn problem(&mut self, message: impl Display) {
        let message = format!("`{}`: {message}", self.prefix);
        self.loader.problem(message);
    }

    /// Ends the load at a config value this scope's weights cannot fit, named by the scope's
    /// full key (see [`WeightLoader::refuse`]).
    pub fn refuse(&mut self, message: impl Display) -> Error {
        let message = format!("`{}`: {message}", self.prefix);
        self.loader.refuse(message)
    }

    /// The loader itself, for reads the scope does not wrap.
    pub(crate) fn loader(&mut self) -> &mut WeightLoader<'a> {
        self.loader
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::Device;

    use super::*;

    #[test]
    fn scopes_join_their_names_with_dots() {
        let mut loader = WeightLoader::random(1, &Device::default());
        let mut model = loader.pp("model");
        let layer = model.pp(format!("layers.{}", 3));
        assert_eq!(
            layer.key("self_attn.q_proj"),
            "model.layers.3.self_attn.q_proj"
        );
        assert_eq!(layer.key(""), "model.layers.3");
        let mut root = loader.pp("");
        assert_eq!(root.pp("lm_head").key("weight"), "lm_head.weight");
    }

    #[test]
    fn problems_name_the_full_key() {
        let mut loader = WeightLoader::random(1, &Device::default());
        loader.pp("model").pp("norm").problem("bad epsilon");
        let error = loader
            .finish()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("`model.norm`: bad epsilon"), "{error}");
    }
}
