//! The residual block shared by sequential pre-norm decoders (GPT-2, Llama, ...): it serves the
//! block-level sites in contract order around the adapter's mixer and MLP.

use burn::tensor::Tensor;

use crate::call::Call;
use crate::error::Result;
use crate::schema::{LayerSite, Site};

/// `h + mixer(h)`, then, if the block has one, `h + mlp(h)`, serving `layer_input`,
/// `attention_output`, `residual_mid`, `mlp_output` and `layer_output` of `layer`. The closures
/// apply their own norms; the mixer serves its interior sites, the MLP `mlp_input` and its own.
pub fn residual_block<Mlp: FnOnce(Tensor<3>, &mut Call<'_>) -> Result<Tensor<3>>>(
    layer: usize,
    hidden: Tensor<3>,
    call: &mut Call<'_>,
    mixer: impl FnOnce(Tensor<3>, &mut Call<'_>) -> Result<Tensor<3>>,
    mlp: Option<Mlp>,
) -> Result<Tensor<3>> {
    let site = |site| Site::layer(layer, site);
    let hidden = call.visit(site(LayerSite::LayerInput), hidden)?;
    let mixed = mixer(hidden.clone(), call)?;
    let attention_output = call.visit(site(LayerSite::AttentionOutput), mixed)?;
    let mut hidden = hidden + attention_output;
    if let Some(mlp) = mlp {
        hidden = call.visit(site(LayerSite::ResidualMid), hidden)?;
        let mlp_output = mlp(hidden.clone(), call)?;
        let mlp_output = call.visit(site(LayerSite::MlpOutput), mlp_output)?;
        hidden = hidden + mlp_output;
    }
    call.visit(site(LayerSite::LayerOutput), hidden)
}

/// GPT-NeoX's and GPT-J's parallel residual: `h + mixer(h) + mlp(h)`, both reading the block's
/// input, serving `layer_input`, `attention_output`, `mlp_output` and `layer_output` in
/// contract order (the MLP serves `mlp_input` and its own sites; there is no `residual_mid`).
pub fn parallel_residual_block(
    layer: usize,
    hidden: Tensor<3>,
    call: &mut Call<'_>,
    mixer: impl FnOnce(Tensor<3>, &mut Call<'_>) -> Result<Tensor<3>>,
    mlp: impl FnOnce(Tensor<3>, &mut Call<'_>) -> Result<Tensor<3>>,
) -> Result<Tensor<3>> {
    let site = |site| Site::layer(layer, site);
    let hidden = call.visit(site(LayerSite::LayerInput), hidden)?;
    let mixed = mixer(hidden.clone(), call)?;
    let attention_output = call.visit(site(LayerSite::AttentionOutput), mixed)?;
    let mlp_output = mlp(hidden.clone(), call)?;
    let mlp_output = call.visit(site(LayerSite::MlpOutput), mlp_output)?;
    call.visit(
        site(LayerSite::LayerOutput),
        hidden + attention_output + mlp_output,
    )
}
