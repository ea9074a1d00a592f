//! The output projection of softmax attention, serving what each head writes into the residual
//! stream (`attention_head_writes`, TransformerLens' `attn.hook_result`) when a request reads or
//! writes it.

use burn::tensor::Tensor;

use super::Linear;
use crate::call::Call;
use crate::error::Result;
use crate::schema::{MixerSite, Site};

/// `projection(merged)` for the merged outputs `[B, T, NH * D]` of `heads` heads of `layer`.
///
/// When `layers.{layer}.self_attn.attention_head_writes` is observed, each head's write
/// `[B, T, NH, H]` is its slice of the projection's matrix applied to its own output (one
/// product per head over that head's rows of the matrix: the projection's multiply-adds once
/// more), and is served; if a request writes it, what flows on is the sum of the heads plus the
/// projection's bias. Otherwise the projection runs as it always does.
pub fn project_heads(
    layer: usize,
    heads: usize,
    merged: Tensor<3>,
    projection: &Linear,
    call: &mut Call<'_>,
) -> Result<Tensor<3>> {
    let site = Site::self_attn(layer, MixerSite::AttentionHeadWrites);
    if !call.observes(site) {
        return Ok(projection.forward(merged));
    }
    let [batch, tokens, width] = merged.dims();
    let head_dim = width / heads;
    let writes: Vec<Tensor<3>> = (0..heads)
        .map(|head| {
            let inputs = head * head_dim..(head + 1) * head_dim;
            let own = merged.clone().slice_dim(2, inputs.clone());
            projection.forward_inputs(own, inputs)
        })
        .collect();
    let writes: Tensor<4> = Tensor::stack(writes, 2);
    let written = call.writes(site);
    let writes = call.visit(site, writes)?;
    if !written {
        return Ok(projection.forward(merged));
    }
    let [.., hidden] = writes.dims();
    let summed: Tensor<3> = writes.sum_dim(2).reshape([batch, tokens, hidden]);
    Ok(match projection.bias() {
        Some(bias) => summed + bias.clone().unsqueeze::<3>(),
        None => summed,
    })
}
