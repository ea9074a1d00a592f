//! The conformance suite over every registered adapter, and proof that it catches a broken one.

use hookscope::OutputHead;
use hookscope::burn::tensor::Tensor;
use hookscope::cache::ModelCache;
use hookscope::registry;
use hookscope::schema::FeedForwardKind;
use hookscope::{
    ArchConfig, Architecture, BUILTIN, Call, CausalLm, ModelLayout, Result, WeightLoader,
};
use hookscope_arch_gpt2::Gpt2;
use hookscope_conformance::report::{Status, table};
use hookscope_conformance::suite::{run, run_all};
use hookscope_conformance::{fixtures_dir, test_device};

#[test]
fn every_registered_adapter_is_checked_and_every_builtin_passes_with_parity() {
    let fixtures = fixtures_dir();
    let device = test_device();
    println!("on {}", hookscope::device::describe(&device));
    let reports = run_all(Some(&fixtures), &device);
    let checked: Vec<&str> = reports.iter().map(|r| r.arch).collect();
    let registered: Vec<&str> = registry::registered().iter().map(|a| a.name).collect();
    assert_eq!(
        checked, registered,
        "the suite must check every registered architecture"
    );
    let text = table(&reports);
    println!("{text}");
    for arch in BUILTIN {
        let report = reports
            .iter()
            .find(|r| r.arch == arch.name)
            .unwrap_or_else(|| panic!("built-in `{}` is not registered", arch.name));
        assert!(report.passed(), "{text}");
        // A built-in architecture comes with a fixture case: parity must have run.
        assert_eq!(
            report.check("transformers parity").map(|c| c.status),
            Some(Status::Pass),
            "`{}` needs a parity fixture (conformance/scripts/make_fixtures.py)\n{text}",
            arch.name
        );
    }
}

#[test]
fn without_fixtures_parity_is_reported_skipped_not_passed() {
    let report = run(BUILTIN[0], None, &test_device());
    let parity = report.check("transformers parity").unwrap();
    assert_eq!(parity.status, Status::Skipped);
    assert!(parity.detail.contains("--fixtures"), "{}", parity.detail);
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
            layer.feed_forward = FeedForwardKind::None;
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
    fn forward(&self, call: &mut Call<'_>) -> Result<Tensor<3>> {
        self.inner.forward(call)
    }
    fn output_head(&self) -> &dyn OutputHead {
        self.inner.output_head()
    }
}

/// The broken adapter, checked directly: it is not registered, so no other test (nor the suite
/// over every registered architecture) sees it.
static MISDECLARED: Architecture = hookscope::architecture!(
    Misdeclared,
    name: "misdeclared",
    model_types: ["misdeclared-gpt2"],
    architectures: [],
    tiny_config: r#"{"model_type": "gpt2", "vocab_size": 61, "n_positions": 32, "n_embd": 16,
        "n_layer": 2, "n_head": 2}"#,
);

#[test]
fn a_misdeclared_adapter_fails_with_the_first_difference() {
    let report = run(&MISDECLARED, Some(&fixtures_dir()), &test_device());
    assert!(!report.passed());
    let status = |name: &str| {
        let check = report.check(name).unwrap();
        (check.status, check.detail.clone())
    };
    let (served, detail) = status("sites served once");
    assert_eq!(served, Status::Fail);
    assert!(
        detail.contains("layers.0.residual_mid") && detail.contains("undeclared"),
        "{detail}"
    );
    let (order, detail) = status("contract order");
    assert_eq!(order, Status::Fail);
    assert!(detail.contains("residual_mid"), "{detail}");
    assert_eq!(status("next_token_probs").0, Status::Pass);
}
