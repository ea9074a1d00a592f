//! Decay inside a chunk of a chunked linear recurrence (Mamba-2's scan, the gated delta rule):
//! how much of position `s`'s contribution survives at position `l`.

use burn::tensor::{Bool, Tensor};

/// The decay between positions of each chunk, from the per-position log-decays `x`
/// `[..., L]`: `[..., L, L]` with `out[l, s] = Π_{s<k≤l} exp(x_k)` for `s ≤ l` and 0 above the
/// diagonal. A running product of `L` exponentials, not the exponential of `L²` segment sums:
/// as precise (no difference of large running sums) and `L` times fewer `exp`s.
pub fn decay_matrix(x: Tensor<4>) -> Tensor<5> {
    let [batch, heads, chunks, length] = x.dims();
    let device = x.device();
    let shape = [batch, heads, chunks, length, length];
    let on_or_above: Tensor<5, Bool> = Tensor::<2, Bool>::tril_mask([length, length], -1, &device)
        .unsqueeze::<5>()
        .expand(shape);
    // factors[l, s] = exp(x_l) below the diagonal, 1 on and above it.
    let factors = super::exp(x)
        .unsqueeze_dim::<5>(4)
        .expand(shape)
        .mask_fill(on_or_above, 1.0);
    let above: Tensor<5, Bool> = Tensor::<2, Bool>::tril_mask([length, length], 0, &device)
        .unsqueeze::<5>()
        .expand(shape);
    factors.cumprod(3).mask_fill(above, 0.0)
}

/// The same decay as [`decay_matrix`] from the running sums `cumulative` `[..., L]` of the
/// log-decays: `exp(cumulative_l - cumulative_s)` for `s ≤ l`, 0 above the diagonal. This is
/// how transformers' gated delta rule computes it (its rounding, at `L²` exponentials).
pub fn pairwise_decay(cumulative: Tensor<4>) -> Tensor<5> {
    let [batch, heads, chunks, length] = cumulative.dims();
    let shape = [batch, heads, chunks, length, length];
    let above: Tensor<5, Bool> =
        Tensor::<2, Bool>::tril_mask([length, length], 0, &cumulative.device())
            .unsqueeze::<5>()
            .expand(shape);
    let differences = cumulative.clone().unsqueeze_dim::<5>(4) - cumulative.unsqueeze_dim::<5>(3);
    super::exp(differences.mask_fill(above, f32::NEG_INFINITY))
}
