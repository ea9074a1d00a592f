#!/usr/bin/env python3
"""Reference results of edits (steering, patching, ablation) and of the logit lens, made with
`transformers` and torch hooks on committed fixtures.

For each fixture named below, loads its checkpoint with `transformers`, writes the operands
(a steering vector, a patch) and the expected results to `edits.safetensors`, and the cases in
hookscope's own argument syntax to `edits.json`. The Rust test `conformance/tests/checks/edits.rs`
runs each case through the same parser the CLI uses and compares, so CI needs no Python.

    python conformance/scripts/make_edit_fixtures.py

Each case is a greedy generation of NEW_TOKENS tokens from the fixture's first prompt with one
edit (steering, patching, zeroing, a head ablation before the output projection and as a write
to the head's residual write, a neuron ablation, a router write); the reference keeps the output
ids and every step's last-position logits.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, GenerationConfig

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CASES_FOR = ["gpt2-tied", "llama-gqa2-llama3-bias", "mamba-tied", "qwen3.5-dense", "mixtral-top2"]
NEW_TOKENS = 3


class Steps:
    """Counts forward calls (= generation steps) so hooks can act at chosen steps."""

    def __init__(self, model):
        self.step = -1
        model.register_forward_pre_hook(self.advance)

    def advance(self, *_):
        self.step += 1


def parts(model):
    """The blocks, final norm and each block's attention output projection (None: no attention)."""
    body = next(getattr(model, n) for n in ("transformer", "backbone", "model") if hasattr(model, n))
    blocks = body.h if hasattr(body, "h") else body.layers
    norm = next(getattr(body, n) for n in ("ln_f", "norm_f", "norm") if hasattr(body, n))

    def out_proj(block):
        attn = getattr(block, "attn", None) or getattr(block, "self_attn", None)
        if attn is None:
            return None
        return getattr(attn, "c_proj", None) or getattr(attn, "o_proj", None)

    return blocks, norm, [out_proj(b) for b in blocks]


def block_output_hook(edit, steps, at):
    """A forward hook on a block replacing its hidden-state output by edit(output) at `at`."""

    def hook(_module, _args, output):
        if at != "all" and steps.step != at:
            return None
        if isinstance(output, tuple):
            return (edit(output[0]),) + tuple(output[1:])
        return edit(output)

    return hook


def generate(model, prompt, steps):
    steps.step = -1
    ids = torch.tensor([prompt])
    config = GenerationConfig(
        max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=model.config.vocab_size,
        pad_token_id=0, output_logits=True, return_dict_in_generate=True,
    )
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out.sequences[0].to(torch.int64), torch.stack([l[0] for l in out.logits]).float()


def make(name):
    directory = FIXTURES / name
    prompt = json.loads((directory / "reference.json").read_text())["prompts"][0]
    model = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager", dtype=torch.float32).eval()
    steps = Steps(model)
    blocks, norm, out_projs = parts(model)
    hidden = model.config.hidden_size
    generator = torch.Generator().manual_seed(11)
    steer = torch.randn(hidden, generator=generator)
    patch = torch.randn(1, 3, hidden, generator=generator)
    tensors = {"steer": steer, "patch": patch}
    cases = []

    def record(case, hooks, spec):
        handles = [module.register_forward_hook(hook) for module, hook in hooks]
        ids, logits = generate(model, prompt, steps)
        for handle in handles:
            handle.remove()
        tensors[f"{case}/output_ids"] = ids
        tensors[f"{case}/logits"] = logits
        cases.append({"name": case, **spec})

    # Steering: 2.5 x a random [H] vector added to block 1's output at every step.
    record(
        "steer",
        [(blocks[1], block_output_hook(lambda h: h + 2.5 * steer, steps, "all"))],
        {"add": ["layers.1.layer_output@all={dir}/edits.safetensors:steer*2.5"]},
    )

    # Patching: positions 2..5 of block 0's output replaced at the prompt call.
    def set_positions(h):
        h = h.clone()
        h[:, 2:5] = patch
        return h

    record(
        "patch",
        [(blocks[0], block_output_hook(set_positions, steps, 0))],
        {"set": ["layers.0.layer_output[:, 2:5]@0={dir}/edits.safetensors:patch"]},
    )

    # Zeroing part of a value: the first 8 hidden units of block 0's last position, step 0.
    def zero_last(h):
        h = h.clone()
        h[:, -1, :8] = 0
        return h

    record(
        "zero-part",
        [(blocks[0], block_output_hook(zero_last, steps, 0))],
        {"zero": ["layers.0.layer_output[:, -1, :8]@0"]},
    )

    # Head ablation: head 1 of the first attention layer, zeroed before the output projection
    # at every step.
    attention_layer = next((i for i, p in enumerate(out_projs) if p is not None), None)
    if attention_layer is not None:
        heads = model.config.num_attention_heads

        def ablate(_module, args):
            x = args[0]
            b, t, width = x.shape
            x = x.view(b, t, heads, width // heads).clone()
            x[:, :, 1] = 0
            return (x.view(b, t, width),)

        handle = out_projs[attention_layer].register_forward_pre_hook(ablate)
        ids, logits = generate(model, prompt, steps)
        handle.remove()
        tensors["ablate/output_ids"] = ids
        tensors["ablate/logits"] = logits
        site = f"layers.{attention_layer}.self_attn.attention_head_outputs[:, :, 1]"
        cases.append({"name": "ablate", "zero": [f"{site}@all"]})

    # The same head ablation as a write to what the head adds to the residual stream: its
    # product with the output projection zeroed (the projection's bias still added).
    if attention_layer is not None:
        handle = out_projs[attention_layer].register_forward_pre_hook(ablate)
        ids, logits = generate(model, prompt, steps)
        handle.remove()
        tensors["ablate-write/output_ids"] = ids
        tensors["ablate-write/logits"] = logits
        site = f"layers.{attention_layer}.self_attn.attention_head_writes[:, :, 1]"
        cases.append({"name": "ablate-write", "zero": [f"{site}@all"]})

    # Neuron ablation: neurons 5..7 of block 0's dense MLP zeroed where the down projection
    # reads them, at every step.
    mlp = getattr(blocks[0], "mlp", None)
    down = None if mlp is None or hasattr(mlp, "experts") else getattr(mlp, "down_proj", None) or getattr(mlp, "c_proj", None)
    if down is not None:
        def ablate_neurons(_module, args):
            x = args[0].clone()
            x[..., 5:8] = 0
            return (x,)

        handle = down.register_forward_pre_hook(ablate_neurons)
        ids, logits = generate(model, prompt, steps)
        handle.remove()
        tensors["neurons/output_ids"] = ids
        tensors["neurons/logits"] = logits
        cases.append({"name": "neurons", "zero": ["layers.0.mlp.post_activation[:, :, 5:8]@all"]})

    # A router write: 3.0 added to expert 0's router logit in block 1 at every step, the
    # routing recomputed from the written logits as the router does (softmax, top k,
    # renormalised).
    if mlp is not None and hasattr(mlp, "experts"):
        router = blocks[1].mlp.gate

        def reroute(module, _args, output):
            logits = output[0].clone()
            logits[:, 0] += 3.0
            probs = torch.softmax(logits.float(), dim=-1)
            top, chosen = torch.topk(probs, module.top_k, dim=-1)
            gaps = probs.sort(dim=-1, descending=True).values
            assert (gaps[:, module.top_k - 1] - gaps[:, module.top_k]).min() > 1e-3, "a near-tie after the write"
            return logits, top / top.sum(dim=-1, keepdim=True), chosen

        handle = router.register_forward_hook(reroute)
        ids, logits = generate(model, prompt, steps)
        handle.remove()
        tensors["router/output_ids"] = ids
        tensors["router/logits"] = logits
        cases.append({"name": "router", "add": ["layers.1.mlp.router_logits[:, :, 0]@all=3.0"]})

    # The logit lens at the prompt call: every block's output through the final norm and head.
    outputs = []
    handles = [b.register_forward_hook(lambda m, a, o: outputs.append(o[0] if isinstance(o, tuple) else o)) for b in blocks]
    with torch.no_grad():
        model(torch.tensor([prompt]))
    for handle in handles:
        handle.remove()
    with torch.no_grad():
        lens = torch.stack([torch.softmax(model.get_output_embeddings()(norm(h)), dim=-1)[0] for h in outputs])
    tensors["lens"] = lens.float()

    save_file({k: v.contiguous() for k, v in tensors.items()}, directory / "edits.safetensors")
    meta = {"prompt": prompt, "new_tokens": NEW_TOKENS, "cases": cases}
    (directory / "edits.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{name}: {len(cases)} cases")


def main():
    torch.manual_seed(0)
    for name in CASES_FOR:
        make(name)


if __name__ == "__main__":
    main()
