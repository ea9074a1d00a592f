//! The conformance suite over every built-in adapter, and proof that it catches a broken one.

use hookscope_arch_gpt2::Gpt2;
use hookscope_conformance::fixtures_dir;
use hookscope_conformance::suite::{run, run_all, table};
use hookscope_core::cache::ModelCache;
use hookscope_core::{
    ArchConfig, Architecture, CallInput, CausalLm, Hooks, ModelLayout, Result, WeightLoader,
};

#[test]
fn every_builtin_adapter_passes_every_check() {
    let reports = run_all(&fixtures_dir());
    let names: Vec<&str> = reports.iter().map(|r| r.arch).collect();
    assert!(
        names.contains(&"gpt2") && names.contains(&"llama"),
        "{names:?}"
    );
    let text = table(&reports);
    println!("{text}");
    for report in reports.iter().filter(|r| r.arch != "misdeclared") {
        assert!(report.passed(), "{text}");
        let parity = report
            .checks
            .iter()
            .find(|c| c.check == "transformers parity");
        assert_eq!(parity.map(|c| c.status), Some("pass"), "{text}");
    }
}

/// GPT-2 that declares no MLP but serves `mlp_output` anyway.
struct Misdeclared {
    inner: Gpt2,
    layout: ModelLayout,
}

impl Misdeclared {
    fn load(config: &ArchConfig, loader: &mut WeightLoader<'_>) -> Result<Self> {
        let inner = Gpt2::load(config, loader)?;
        let mut layout = inner.layout().clone();
        for layer in &mut layout.layers {
            layer.has_mlp = false;
        }
        Ok(Misdeclared { inner, layout })
    }
}

impl CausalLm for Misdeclared {
    fn layout(&self) -> &ModelLayout {
        &self.layout
    }
    fn max_positions(&self) -> Option<usize> {
        self.inner.max_positions()
    }
    fn new_cache(&self) -> ModelCache {
        self.inner.new_cache()
    }
    fn forward(
        &self,
        input: &CallInput,
        cache: &mut ModelCache,
        hooks: &mut Hooks<'_>,
    ) -> Result<hookscope_core::burn::tensor::Tensor<3>> {
        self.inner.forward(input, cache, hooks)
    }
}

hookscope_core::register_architecture!(
    Misdeclared,
    name: "misdeclared",
    model_types: ["misdeclared-gpt2"],
    architectures: [],
    tiny_config: r#"{"model_type": "gpt2", "vocab_size": 61, "n_positions": 32, "n_embd": 16,
        "n_layer": 2, "n_head": 2}"#,
);

#[test]
fn a_misdeclared_adapter_fails_with_the_first_difference() {
    let arch: &'static Architecture = hookscope_core::registry::registered()
        .into_iter()
        .find(|a| a.name == "misdeclared")
        .unwrap();
    let report = run(arch, &fixtures_dir());
    assert!(!report.passed());
    let status = |name: &str| {
        let check = report.checks.iter().find(|c| c.check == name).unwrap();
        (check.status, check.detail.clone())
    };
    let (served, detail) = status("sites served once");
    assert_eq!(served, "fail");
    assert!(
        detail.contains("layers.0.mlp_output") && detail.contains("undeclared"),
        "{detail}"
    );
    let (order, detail) = status("contract order");
    assert_eq!(order, "fail");
    assert!(detail.contains("mlp_output"), "{detail}");
    assert_eq!(status("next_token_probs").0, "pass");
}
