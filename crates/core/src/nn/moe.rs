//! The sparse mixture-of-experts block of Mixtral and the Qwen MoE decoders ("Mixtral of
//! Experts", Jiang et al. 2024): a router picks the top `k` experts per token from a softmax
//! over `E`, the chosen gated MLPs run on their tokens only, their outputs are summed with the
//! router's weights, and an optional shared expert, scaled by `sigmoid(shared_expert_gate(x))`,
//! is added (Qwen2-MoE, Qwen3-Next).

use burn::tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData, activation};

use super::mlp::{mlp_site, serve_mlp_input};
use super::{Activation, GatedMlp, GatedMlpSpec, Linear};
use crate::call::Call;
use crate::error::{Error, Result};
use crate::schema::{FeedForwardKind, MlpSite, Site};
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

    /// The part's kind, for the layout.
    pub fn kind(&self) -> FeedForwardKind {
        FeedForwardKind::Sparse {
            experts: self.spec.experts,
            top_k: self.spec.top_k,
        }
    }

    /// The block on `x` `[B, T, H]` (what it reads): routed experts plus the gated shared
    /// expert, serving `mlp_input` and the routing sites of `layer` in contract order. The
    /// experts run as the served routing says, so a write to the router logits reroutes, and
    /// written expert indices or weights are used as written.
    pub fn serve(&self, layer: usize, x: Tensor<3>, call: &mut Call<'_>) -> Result<Tensor<3>> {
        let x = serve_mlp_input(layer, x, call)?;
        let [batch, tokens, hidden] = x.dims();
        let flat: Tensor<2> = x.reshape([batch * tokens, hidden]);
        let logits = self.router.forward(flat.clone());
        let logits = call.visit(
            mlp_site(layer, MlpSite::RouterLogits),
            logits.reshape([batch, tokens, self.spec.experts]),
        )?;
        let probabilities = activation::softmax(logits, 2);
        let chosen = self.choose(
            &probabilities
                .clone()
                .into_data()
                .convert::<f32>()
                .try_into_vec::<f32>()?,
        );
        let device = flat.device();
        let top_k = self.spec.top_k;
        let shape = [batch, tokens, top_k];
        let indices_site = mlp_site(layer, MlpSite::ExpertIndices);
        let indices_written = call.writes(indices_site);
        let chosen_tensor = Tensor::<3>::from_data(TensorData::new(chosen.clone(), shape), &device);
        let indices = call.visit(indices_site, chosen_tensor)?;
        // The weights are the chosen experts' probabilities taken from the tensor (not from
        // the host copy), so that gradients reach the router through them.
        let picked = probabilities.gather(2, chosen_tensor_int(&chosen, shape, &device));
        let weights = match self.spec.renormalise {
            true => picked.clone() / picked.sum_dim(2),
            false => picked,
        };
        let weights_site = mlp_site(layer, MlpSite::ExpertWeights);
        let weights = call.visit(weights_site, weights)?;
        let experts = match indices_written {
            true => self.written_experts(indices, indices_site)?,
            false => chosen,
        };
        let weights = weights.reshape([batch * tokens * top_k, 1]);
        let mut output = flat.zeros_like();
        for (expert, (rows, slots)) in self.routes(&experts).into_iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let count = rows.len();
            let rows: Tensor<1, Int> = Tensor::from_data(TensorData::new(rows, [count]), &device);
            let slots: Tensor<1, Int> = Tensor::from_data(TensorData::new(slots, [count]), &device);
            let weights = weights.clone().select(0, slots);
            let routed =
                self.experts[expert].forward(flat.clone().select(0, rows.clone())) * weights;
            output = output.select_assign(0, rows, routed, IndexingUpdateOp::Add);
        }
        if let Some((mlp, gate)) = &self.shared {
            output = output + activation::sigmoid(gate.forward(flat.clone())) * mlp.forward(flat);
        }
        Ok(output.reshape([batch, tokens, hidden]))
    }

    /// Each row's top `k` experts by probability (ties to the lower expert index), in
    /// increasing index, as floats: `[rows * k]`.
    fn choose(&self, probabilities: &[f32]) -> Vec<f32> {
        let (experts, top_k) = (self.spec.experts, self.spec.top_k);
        let rows = probabilities.len() / experts;
        let mut chosen = Vec::with_capacity(rows * top_k);
        for probs in probabilities.chunks(experts) {
            let mut order: Vec<usize> = (0..experts).collect();
            order.sort_by(|a, b| probs[*b].total_cmp(&probs[*a]).then(a.cmp(b)));
            order.truncate(top_k);
            // In increasing index: an order no near-tie between chosen experts can flip.
            order.sort_unstable();
            chosen.extend(order.into_iter().map(|expert| expert as f32));
        }
        chosen
    }

    /// Written expert indices, checked: whole numbers below the number of experts.
    fn written_experts(&self, indices: Tensor<3>, site: Site) -> Result<Vec<f32>> {
        let values = indices.into_data().convert::<f32>().try_into_vec::<f32>()?;
        let experts = self.spec.experts;
        match values
            .iter()
            .find(|v| !(v.fract() == 0.0 && **v >= 0.0 && **v < experts as f32))
        {
            Some(bad) => Err(Error::Edit {
                site: site.to_string(),
                message: format!(
                    "it was written with {bad}: expert indices must be whole numbers from 0 to {}",
                    experts - 1
                ),
            }),
            None => Ok(values),
        }
    }

    /// Per expert, the rows routed to it and the slots (`row * k + j`) of their weights, from
    /// each row's `k` chosen experts.
    fn routes(&self, experts: &[f32]) -> Vec<(Vec<i64>, Vec<i64>)> {
        let top_k = self.spec.top_k;
        let mut routes = vec![(Vec::new(), Vec::new()); self.spec.experts];
        for (row, chosen) in experts.chunks(top_k).enumerate() {
            for (j, expert) in chosen.iter().enumerate() {
                let route = &mut routes[*expert as usize];
                route.0.push(row as i64);
                route.1.push((row * top_k + j) as i64);
            }
        }
        routes
    }
}

/// The chosen experts (whole numbers as floats) as integer indices `[B, T, k]`.
fn chosen_tensor_int(chosen: &[f32], shape: [usize; 3], device: &Device) -> Tensor<3, Int> {
    let indices: Vec<i64> = chosen.iter().map(|expert| *expert as i64).collect();
    Tensor::from_data(TensorData::new(indices, shape), device)
}
