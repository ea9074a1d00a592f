//! What a trace or a generation reports (`hookscope run --json`, `POST /v1/run`), and the saved
//! values as named tensors.

use hookscope_core::burn::tensor::TensorData;
use hookscope_core::decoding::top_k;
use hookscope_core::{Generation, Model, Result, Saved, Trace};
use serde_json::{Value, json};

use super::{Candidate, candidates, candidates_json};

/// The `k` most likely next tokens of each row of a trace.
pub fn top_next_tokens(model: &Model, trace: &Trace, k: usize) -> Result<Vec<Vec<Candidate>>> {
    let next_token_probs = trace.next_token_probs()?;
    let [_, vocab] = next_token_probs.dims();
    let probs = hookscope_core::host::f32_values(next_token_probs.to_data())?;
    probs
        .chunks(vocab.max(1))
        .map(|row| candidates(model, top_k(row, k)))
        .collect()
}

/// The saved values' keys and shapes, `[{"key", "shape"}]`.
fn saved_json(saved: &Saved) -> Vec<Value> {
    saved
        .iter()
        .map(|entry| json!({"key": entry.key(), "shape": entry.shape()}))
        .collect()
}

/// A trace's report: per prompt its ids and `top` most likely next tokens, and the saved
/// values' keys and shapes (`{"prompts": [{"prompt", "input_ids", "top_next_tokens"}],
/// "saved": [...]}`).
pub fn trace_json(model: &Model, prompts: &[String], trace: &Trace, top: usize) -> Result<Value> {
    let candidates = top_next_tokens(model, trace, top)?;
    let prompts: Vec<Value> = prompts
        .iter()
        .zip(&candidates)
        .zip(&trace.batch.ids)
        .map(|((prompt, candidates), ids)| {
            json!({
                "prompt": prompt,
                "input_ids": ids,
                "top_next_tokens": candidates_json(candidates),
            })
        })
        .collect();
    Ok(json!({"prompts": prompts, "saved": saved_json(&trace.saved)}))
}

/// A generation's report: per prompt its ids, new ids, continuation and each step's token and
/// `top` most likely next tokens (at most those the generation kept), the steps run and the
/// saved values' keys and shapes.
pub fn generation_json(
    model: &Model,
    prompts: &[String],
    generation: &Generation,
    top: usize,
) -> Result<Value> {
    let prompts = prompts
        .iter()
        .enumerate()
        .map(|(row, prompt)| {
            let steps = generation.top_next_tokens[row]
                .iter()
                .enumerate()
                .map(|(step, best)| {
                    let best = best.iter().take(top).map(|(id, p)| (*id as usize, *p));
                    let best = candidates(model, best.collect())?;
                    Ok(json!({
                        "step": step,
                        "token": generation.new_tokens(row).get(step),
                        "top_next_tokens": candidates_json(&best),
                    }))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(json!({
                "prompt": prompt,
                "input_ids": prompt_ids(generation, row),
                "new_ids": generation.new_tokens(row),
                "continuation": continuation(model, generation, row)?,
                "steps": steps,
            }))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(json!({
        "prompts": prompts, "steps": generation.steps, "saved": saved_json(&generation.saved),
    }))
}

/// Row `row`'s new tokens as text (their ids where the model has no tokenizer).
pub fn continuation(model: &Model, generation: &Generation, row: usize) -> Result<String> {
    let tokens = generation.new_tokens(row);
    match model.tokenizer() {
        Some(tokenizer) => tokenizer.decode(tokens),
        None => Ok(format!("{tokens:?}")),
    }
}

/// Row `row`'s prompt ids, without left padding.
fn prompt_ids(generation: &Generation, row: usize) -> Vec<u32> {
    let prompt = generation.prompt_len;
    generation.output_ids[row][..prompt]
        .iter()
        .zip(&generation.attention_mask[row][..prompt])
        .filter(|(_, real)| **real)
        .map(|(id, _)| *id)
        .collect()
}

/// Every gradient as `grad:{site}@{step}` (what `--out` writes beside the saved values).
pub fn gradient_tensors(gradients: &Saved) -> Vec<(String, TensorData)> {
    gradients
        .iter()
        .map(|entry| (format!("grad:{}", entry.key()), entry.to_data()))
        .collect()
}

/// The gradients' keys (`grad:{site}@{step}`) and shapes, `[{"key", "shape"}]`.
pub fn gradients_json(gradients: &Saved) -> Value {
    let rows: Vec<Value> = gradients
        .iter()
        .map(|entry| json!({"key": format!("grad:{}", entry.key()), "shape": entry.shape()}))
        .collect();
    Value::Array(rows)
}

/// Every saved value as `{site}@{step}`, then `output_ids` and, for a padded batch,
/// `attention_mask` (both i64 `[B, len]`): what `--out` writes.
pub fn saved_tensors(
    saved: &Saved,
    ids: &[Vec<u32>],
    mask: &[Vec<bool>],
) -> Vec<(String, TensorData)> {
    let mut tensors: Vec<(String, TensorData)> = saved
        .iter()
        .map(|entry| (entry.key(), entry.to_data()))
        .collect();
    let shape = [ids.len(), ids.first().map_or(0, Vec::len)];
    let flat_ids: Vec<i64> = ids.iter().flatten().map(|id| i64::from(*id)).collect();
    tensors.push(("output_ids".into(), TensorData::new(flat_ids, shape)));
    if mask.iter().flatten().any(|real| !real) {
        let flat_mask: Vec<i64> = mask.iter().flatten().map(|m| i64::from(*m)).collect();
        tensors.push(("attention_mask".into(), TensorData::new(flat_mask, shape)));
    }
    tensors
}
