"""Gradient references for hookscope's fixtures (issue 36), from torch autograd.

For every committed fixture (a folder under `conformance/fixtures` with `reference.json`),
loads its checkpoint in `transformers` (f32, eager attention), runs prompt 0's prompt call with
every standard site recorded by `make_fixtures.py`'s hooks, keeps each site's tensor in the
graph (`retain_grad`), and back-propagates two metrics:

- `plain`: `logit-diff:#A,#B` at the last position, A and B the two most likely tokens there;
- `edited`: the mean next-token loss (`loss`) with 0.5 added to `layers.0.layer_output` (a
  forward hook, as `--add layers.0.layer_output=0.5`).

Writes `gradients.safetensors` (`{run}/{site}@0`, f32; zeros where the metric does not depend
on a site) and `gradients.json` (each run's metric and edit) beside the checkpoint.

    python conformance/scripts/make_gradient_fixtures.py [FIXTURE...]
"""

import json
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402  (its hooks name every site as SCHEMA.md does)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

# Sites `make_fixtures.py` records from a side computation (a copy, a recomputation or a split
# the model does not use), outside the graph the metric is computed on: torch gives them no
# gradient, so they are left out. Their neighbours on the graph are checked.
OFF_GRAPH = (
    "self_attn.attention_head_writes",  # per-head products recomputed from o_proj's input
    "self_attn.attention_head_outputs",  # Mamba's scan output, captured from a re-run scan
    "self_attn.state_output",  # Mamba-2's and Bamba's SSD output, captured
    "linear_attn.attention_queries",  # Gated DeltaNet's inputs and output, captured inside
    "linear_attn.attention_keys",  # the delta rule's reference function
    "linear_attn.attention_values",
    "linear_attn.state_output",
    "self_attn.attention_gate",  # Qwen3-Next's output gate, split off a copy of q_proj's output
    "mlp.router_logits",  # MoE routing, recomputed by the recording hook
    "mlp.expert_weights",
)
# Phi-3's fused gate_up output, split by the recording hook (the model splits its own copy).
FUSED_GATE_UP = ("mlp.pre_activation", "mlp.up_projection")


def on_graph(key, architecture):
    site = key.split("@")[0]
    off = OFF_GRAPH + (FUSED_GATE_UP if architecture.startswith("Phi3") else ())
    return not site.endswith(off)


class LiveRecorder(mf.Recorder):
    """Keeps each site's tensor in the graph instead of a detached copy. An `mlp_input` that is
    the residual tensor itself (OLMo-2 has no pre-norm) is left out: torch's gradient of that
    tensor counts both the residual and the MLP branch, where hookscope's `mlp_input` is the MLP
    branch's own input (as TransformerLens' `hook_mlp_in`)."""

    def put(self, site, tensor):
        key = f"{site}@{self.step}"
        if key in self.values or not torch.is_tensor(tensor) or not tensor.is_floating_point():
            return
        aliased = any(kept is tensor for kept in self.values.values())
        if site.endswith(".mlp_input") and aliased:
            return
        if tensor.requires_grad:
            tensor.retain_grad()
            self.values[key] = tensor


def load(directory):
    config = transformers.AutoConfig.from_pretrained(directory)
    model_class = getattr(transformers, config.architectures[0])
    model = model_class.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


def blocks_of(model):
    body = next(getattr(model, n) for n in ("transformer", "backbone", "gpt_neox", "model") if hasattr(model, n))
    body = getattr(body, "language_model", body)
    return body.h if hasattr(body, "h") else body.layers


def gradients(model, prompt, metric, edit):
    """Every recorded site's gradient of `metric(logits, ids)` on `prompt`'s prompt call."""
    recorder = LiveRecorder()
    mf.RECORDER = recorder
    handles = []
    if edit:
        def add_half(_module, _args, output):
            if isinstance(output, tuple):
                return (output[0] + 0.5,) + tuple(output[1:])
            return output + 0.5
        handles.append(blocks_of(model)[0].register_forward_hook(add_half, prepend=True))
    recorder.step = -1  # the model's pre-hook counts the call as step 0
    ids = torch.tensor([prompt])
    with torch.enable_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
        logits = recorder.values["logits@0"]
        value = metric(logits, ids)
        value.backward()
    for handle in handles:
        handle.remove()
    grads = {}
    for key, tensor in recorder.values.items():
        grad = tensor.grad if tensor.grad is not None else torch.zeros_like(tensor)
        grads[key] = grad.detach().to(torch.float32).contiguous().clone()
    return grads, float(value)


def make(directory):
    meta = json.loads((directory / "reference.json").read_text())
    prompt = meta["prompts"][0]
    model = load(directory)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    # Sites need a graph to live in: the embeddings' output requires grad from here on.
    embeddings = model.get_input_embeddings()
    embeddings.register_forward_hook(lambda m, a, o: o.requires_grad_(True))
    mf.attach_hooks(model)

    with torch.no_grad():
        last = model(input_ids=torch.tensor([prompt])).logits[0, -1]
    a, b = (int(i) for i in torch.topk(last, 2).indices)

    def logit_diff(logits, ids):
        return logits[0, -1, a] - logits[0, -1, b]

    def loss(logits, ids):
        return torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:])

    out, runs = {}, {}
    for run, metric, text, edit in [("plain", logit_diff, f"logit-diff:#{a},#{b}", False),
                                    ("edited", loss, "loss", True)]:
        grads, value = gradients(model, prompt, metric, edit)
        for key, grad in grads.items():
            # A large vocabulary's logits gradient (4 MB for GPT-2's) is left out; the metric's
            # own entries are checked on every other fixture.
            large = key.startswith("logits@") and grad.shape[-1] > 4096
            if on_graph(key, model.config.architectures[0]) and not large:
                out[f"{run}/{key}"] = grad
        runs[run] = {"metric": text, "value": value,
                     "add": ["layers.0.layer_output=0.5"] if edit else []}
    save_file(out, directory / "gradients.safetensors")
    (directory / "gradients.json").write_text(json.dumps({"prompt": prompt, "runs": runs}, indent=1) + "\n")
    return len(out)


def main():
    names = sys.argv[1:] or sorted(p.name for p in FIXTURES.iterdir() if (p / "reference.json").exists())
    for name in names:
        count = make(FIXTURES / name)
        print(f"{name}: {count} gradients")


if __name__ == "__main__":
    main()
