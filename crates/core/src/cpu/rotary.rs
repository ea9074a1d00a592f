//! Rotary position embeddings (Su et al. 2021, "RoFormer"), in the rotate-half pairing of
//! GPT-NeoX and Llama, in one pass over the queries or keys: each output row is read from its
//! input row where it lies (the heads are a view of the projection's `[B, T, heads, D]`) and
//! written once. As burn operations it is two slices, a negation, a concatenation, two
//! products and a sum, each a pass over the whole tensor, the first made contiguous by a copy.

use burn::tensor::Tensor;

use super::decode_attention::Strided;
use super::elementwise::CHUNK;
use super::host::{dense_f32, f32_primitive, from_host, parallel_output};
use super::isa::per_vector_level;

/// `x · cos + rotate_half(x) · sin` for `x` `[B, heads, T, D]` (any layout whose last dim is
/// contiguous) and `cos`, `sin` `[B, 1, T, R]`: the first `R` dims rotate (dim `i` with
/// `i + R/2`), the rest pass through; a contiguous `[B, heads, T, D]`. `None` unless all three
/// live on the CPU backend as `f32` with those sizes (`R` even, at most `D`).
pub(crate) fn rotate_half(x: &Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Option<Tensor<4>> {
    let [batch, heads, tokens, dim] = x.dims();
    let [.., rotary] = cos.dims();
    if cos.dims() != [batch, 1, tokens, rotary] || sin.dims() != cos.dims() {
        return None;
    }
    if rotary % 2 != 0 || rotary > dim || [batch, heads, tokens, dim].contains(&0) {
        return None;
    }
    let storage = f32_primitive(x)?;
    let rows = Strided::of(&storage)?;
    let (cos, sin) = (dense_f32(cos)?, dense_f32(sin)?);
    let (cos, sin) = (cos.as_slice::<f32>()?, sin.as_slice::<f32>()?);
    let per_head = tokens * dim;
    let heads_per_task = CHUNK.div_ceil(per_head);
    let run = heads_per_task * per_head;
    let output = parallel_output(batch * heads * per_head, run, |task, out| {
        for (i, out) in out.chunks_exact_mut(per_head).enumerate() {
            let head = task * heads_per_task + i;
            let b = head / heads;
            let angles = b * tokens * rotary..(b + 1) * tokens * rotary;
            let head = HeadRows {
                rows: &rows,
                at: [b, head % heads],
                dim,
                rotary,
            };
            rotate_head(&head, &cos[angles.clone()], &sin[angles], out);
        }
    });
    Some(from_host(output, [batch, heads, tokens, dim]))
}

/// One head's input rows and the dims of each that rotate.
struct HeadRows<'a> {
    rows: &'a Strided<'a>,
    /// `[b, head]`.
    at: [usize; 2],
    /// Dims of a row, and of those the first that rotate.
    dim: usize,
    rotary: usize,
}

per_vector_level! {
    fn rotate_head(head: &HeadRows<'_>, cos: &[f32], sin: &[f32], out: &mut [f32]) {
        let [b, h] = head.at;
        let (dim, half) = (head.dim, head.rotary / 2);
        let angles = cos.chunks_exact(head.rotary).zip(sin.chunks_exact(head.rotary));
        for (t, (out, (cos, sin))) in out.chunks_exact_mut(dim).zip(angles).enumerate() {
            let x = head.rows.row(b, h, t, dim);
            let (turned, kept) = x.split_at(head.rotary);
            let (first, second) = turned.split_at(half);
            let (out, pass) = out.split_at_mut(head.rotary);
            let (out_first, out_second) = out.split_at_mut(half);
            let (cos_first, cos_second) = cos.split_at(half);
            let (sin_first, sin_second) = sin.split_at(half);
            for (((y, &a), &c), (&b, &s)) in out_first
                .iter_mut()
                .zip(first)
                .zip(cos_first)
                .zip(second.iter().zip(sin_first))
            {
                *y = a * c - b * s;
            }
            for (((y, &b), &c), (&a, &s)) in out_second
                .iter_mut()
                .zip(second)
                .zip(cos_second)
                .zip(first.iter().zip(sin_second))
            {
                *y = b * c + a * s;
            }
            pass.copy_from_slice(kept);
        }
    }
}
