//! The sparse mixture-of-experts block of Mixtral and the Qwen MoE decoders ("Mixtral of
//! Experts", Jiang et al. 2024): a router picks the top `k` experts per token from a softmax
//! over `E`, the chosen gated MLPs run on their tokens only, their outputs are summed with the
//! router's weights, and an optional shared expert, scaled by `sigmoid(shared_expert_gate(x))`,
//! is added (Qwen2-MoE, Qwen3-Next).

use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData, activation};

use super::{Activation, GatedMlp, GatedMlpSpec, Linear};
use crate::error::Result;
use crate::weights::WeightScope;

/// The sizes and routing of a mixture-of-experts block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeSpec {
    /// Hidden size.
    pub hidden: usize,
    /// Experts (`E`).
    pub experts: usize,
    /// Experts per token (`k`).
    pub top_k: usize,
    /// Each expert's inner size.
    pub inner: usize,
    /// The shared expert's inner size, if the block has one.
    pub shared_inner: Option<usize>,
    /// Whether the top-`k` weights are renormalised to sum to one.
    pub renormalise: bool,
    /// The experts' activation.
    pub activation: Activation,
}

/// Whether layer `index` of a Qwen-MoE-style decoder is sparse: the config has experts, the
/// layer is not in `mlp_only_layers`, and `index + 1` is a multiple of `decoder_sparse_step`
/// (a step of 0 counts as 1).
pub fn is_sparse_layer(
    index: usize,
    experts: usize,
    decoder_sparse_step: usize,
    mlp_only_layers: &[usize],
) -> bool {
    experts > 0
        && !mlp_only_layers.contains(&index)
        && (index + 1).is_multiple_of(decoder_sparse_step.max(1))
}

/// A loaded mixture-of-experts block.
#[derive(Debug, Clone)]
pub struct SparseMoe {
    spec: MoeSpec,
    router: Linear,
    experts: Vec<GatedMlp>,
    shared: Option<(GatedMlp, Linear)>,
}

impl SparseMoe {
    /// Loads the scope's `gate` (the router), the experts, and `shared_expert` with
    /// `shared_expert_gate`. Experts are read per expert
    /// (`experts.{e}.{gate,up,down}_proj.weight`, or Mixtral's `experts.{e}.{w1,w3,w2}`) or
    /// fused (`experts.gate_up_proj` `[E, 2I, H]`, gate rows first, and `experts.down_proj`
    /// `[E, H, I]`), whichever the checkpoint stores.
    pub fn load(mut scope: WeightScope<'_, '_>, spec: &MoeSpec) -> Result<Self> {
        let MoeSpec {
            hidden,
            experts,
            inner,
            activation,
            ..
        } = *spec;
        if spec.top_k == 0 || spec.top_k > experts {
            return Err(scope.refuse(format!(
                "the config routes each token to {} of {experts} experts \
                 (num_experts_per_tok must be between 1 and num_experts)",
                spec.top_k
            )));
        }
        let fused = "experts.gate_up_proj";
        let experts = if scope.contains(fused) {
            let gate_up: Tensor<3> = scope.tensor(fused, [experts, 2 * inner, hidden])?;
            let down: Tensor<3> = scope.tensor("experts.down_proj", [experts, hidden, inner])?;
            (0..experts)
                .map(|e| {
                    let slice = |t: &Tensor<3>, rows: std::ops::Range<usize>, cols: usize| {
                        t.clone()
                            .slice_dim(0, e..e + 1)
                            .slice_dim(1, rows.clone())
                            .reshape([rows.len(), cols])
                    };
                    GatedMlp::from_out_in(
                        [
                            slice(&gate_up, 0..inner, hidden),
                            slice(&gate_up, inner..2 * inner, hidden),
                            slice(&down, 0..hidden, inner),
                        ],
                        activation,
                    )
                })
                .collect()
        } else {
            let mlp = GatedMlpSpec {
                hidden,
                inner,
                bias: false,
                activation,
            };
            let names = match scope.contains("experts.0.w1.weight") {
                true => ["w1", "w3", "w2"],
                false => ["gate_proj", "up_proj", "down_proj"],
            };
            (0..experts)
                .map(|e| GatedMlp::load_named(scope.pp(format!("experts.{e}")), &mlp, names))
                .collect::<Result<_>>()?
        };
        let shared = match spec.shared_inner {
            None => None,
            Some(inner) => {
                let mlp = GatedMlpSpec {
                    hidden,
                    inner,
                    bias: false,
                    activation,
                };
                Some((
                    GatedMlp::load(scope.pp("shared_expert"), &mlp)?,
                    Linear::load_torch(scope.pp("shared_expert_gate"), hidden, 1, false)?,
                ))
            }
        };
        Ok(SparseMoe {
            router: Linear::load_torch(scope.pp("gate"), hidden, spec.experts, false)?,
            experts,
            shared,
            spec: *spec,
        })
    }

    /// The block on `x` `[B, T, H]`: routed experts plus the gated shared expert.
    pub fn forward(&self, x: Tensor<3>) -> Result<Tensor<3>> {
        let [batch, tokens, hidden] = x.dims();
        let flat: Tensor<2> = x.reshape([batch * tokens, hidden]);
        let probabilities = activation::softmax(self.router.forward(flat.clone()), 1)
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()?;
        let mut output = flat.zeros_like();
        for (expert, (rows, weights)) in self.routes(&probabilities).into_iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let device = flat.device();
            let count = rows.len();
            let rows: Tensor<1, Int> = Tensor::from_data(TensorData::new(rows, [count]), &device);
            let weights: Tensor<2> =
                Tensor::from_data(TensorData::new(weights, [count, 1]), &device);
            let routed =
                self.experts[expert].forward(flat.clone().select(0, rows.clone())) * weights;
            output = output.select_assign(0, rows, routed, IndexingUpdateOp::Add);
        }
        if let Some((mlp, gate)) = &self.shared {
            output = output + activation::sigmoid(gate.forward(flat.clone())) * mlp.forward(flat);
        }
        Ok(output.reshape([batch, tokens, hidden]))
    }

    /// Per expert, the rows routed to it and their weights: each row's top `k` probabilities
    /// (ties to the lower expert index), renormalised if the block says so.
    fn routes(&self, probabilities: &[f32]) -> Vec<(Vec<i64>, Vec<f32>)> {
        let experts = self.spec.experts;
        let mut routes = vec![(Vec::new(), Vec::new()); experts];
        for (row, probs) in probabilities.chunks(experts).enumerate() {
            let mut order: Vec<usize> = (0..experts).collect();
            order.sort_by(|a, b| probs[*b].total_cmp(&probs[*a]).then(a.cmp(b)));
            order.truncate(self.spec.top_k);
            let total: f32 = order.iter().map(|e| probs[*e]).sum();
            let scale = if self.spec.renormalise { total } else { 1.0 };
            for expert in order {
                routes[expert].0.push(row as i64);
                routes[expert].1.push(probs[expert] / scale);
            }
        }
        routes
    }
}
