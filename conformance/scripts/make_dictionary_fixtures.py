#!/usr/bin/env python3
"""Reference results of sparse dictionaries (SAEs and transcoders), made with SAELens and
`transformers` on committed fixtures.

For each fixture named below, loads its checkpoint with `transformers`, makes a few tiny dictionaries
with SAELens's own classes (seeded random weights whose biases are fitted to the fixture's
activations, so that a useful share of features fire and none sits near its threshold), saves each
with `save_model` under `dictionaries/<name>/` (and one in Gemma Scope's `params.npz` format), and
writes the expected results to `dictionaries.safetensors` and the cases in hookscope's own
argument syntax to `dictionaries.json`. The Rust test compares against them, so CI needs no Python.

It also makes circuit-tracer's per-layer transcoder sets (a folder with `config.yaml` and one
transcoder per layer: circuit-tracer's own `layer_L.safetensors`, or Gemma Scope `params.npz`
files the config lists), loads each with circuit-tracer's own loaders, and takes the references
from them: features, reconstructions and errors of every layer, and a feature ablated at every
step. circuit-tracer 0.5 pins huggingface-hub < 1, which transformers 5 does not allow, so it is
installed without its dependencies (its transcoder code needs only torch, numpy, safetensors
and PyYAML):

    pip install torch "transformers==5.24.*" sae-lens pyyaml
    pip install --no-deps circuit-tracer==0.5.0
    python conformance/scripts/make_dictionary_fixtures.py

For every dictionary the reference keeps, at the prompt call of the fixture's first prompt, the
features, the reconstruction and the error (site value minus reconstruction). Each edit case is a
greedy generation of NEW_TOKENS tokens where the dictionary's site value is replaced by
decode(edited features) + (value - decode(clean features)), SAELens's use_error_term=True (a
splice keeps the reconstruction alone); the reference keeps the output ids and every step's
last-position logits, as make_edit_fixtures.py does.
"""

import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here downloads; make sure of it

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

import sae_lens.loading.pretrained_sae_loaders as loaders
from sae_lens import (
    SAE,
    GatedSAE,
    GatedSAEConfig,
    JumpReLUSAE,
    JumpReLUSAEConfig,
    JumpReLUTranscoder,
    JumpReLUTranscoderConfig,
    SkipTranscoder,
    SkipTranscoderConfig,
    StandardSAE,
    StandardSAEConfig,
    TopKSAE,
    TopKSAEConfig,
)
from sae_lens.loading.pretrained_sae_loaders import handle_config_defaulting
from sae_lens.saes.sae import SAEMetadata

import yaml
import huggingface_hub.constants

# circuit-tracer 0.5 reads a constant huggingface-hub 1.x no longer has; it only matters for
# downloads, which nothing here does.
huggingface_hub.constants.HF_HUB_ENABLE_HF_TRANSFER = False
from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set  # noqa: E402
from circuit_tracer.utils.hf_utils import resolve_transcoder_paths  # noqa: E402

# The step counter and the greedy generation the edit references are made with.
from make_edit_fixtures import FIXTURES, NEW_TOKENS, Steps, generate

D_SAE = 24
MARGIN = 1e-3  # least distance of any pre-activation from its threshold, gate or top-k cut

# TransformerLens hook names (what SAELens's cfg.json metadata.hook_name holds) of hookscope sites.
TL_NAMES = {
    "layer_input": "hook_resid_pre",
    "layer_output": "hook_resid_post",
    "attention_output": "hook_attn_out",
    "mlp_output": "hook_mlp_out",
    "self_attn.attention_head_outputs": "attn.hook_z",
}

# The dictionaries of each fixture. `site` is where the dictionary attaches (a transcoder's output
# site); `input_site` is a transcoder's input; `head` reads and replaces one head of hook_z.
DICTIONARIES = {
    "gpt2-tied": [
        {"name": "resid-standard", "arch": "standard", "site": "layers.1.layer_input"},
        {"name": "resid-topk", "arch": "topk", "site": "layers.0.layer_output", "k": 3, "rescale": True},
        {"name": "z-standard", "arch": "standard", "site": "layers.0.self_attn.attention_head_outputs",
         "reshape": "hook_z"},
        {"name": "z-head1", "arch": "standard", "site": "layers.1.self_attn.attention_head_outputs", "head": 1},
        {"name": "mlp-gated", "arch": "gated", "site": "layers.1.mlp_output"},
        {"name": "resid-norm-rescale", "arch": "standard", "site": "layers.1.layer_output",
         "normalize": "constant_norm_rescale"},
        {"name": "transcoder-skip", "arch": "skip_transcoder", "input_site": "layers.1.layer_input",
         "site": "layers.1.mlp_output"},
    ],
    "llama-gqa2-llama3-bias": [
        {"name": "resid-jumprelu", "arch": "jumprelu", "site": "layers.1.layer_output"},
        {"name": "resid-layernorm", "arch": "standard", "site": "layers.0.layer_output", "normalize": "layer_norm"},
        {"name": "attn-topk", "arch": "topk", "site": "layers.0.attention_output", "k": 4, "rescale": False},
        {"name": "transcoder-jumprelu", "arch": "jumprelu_transcoder", "input_site": "layers.0.attention_output",
         "site": "layers.0.mlp_output"},
    ],
    "gemma2-window-softcap": [
        # Gemma Scope's SAEs do not subtract b_dec from the input; the npz twin is made from this one.
        {"name": "resid-jumprelu", "arch": "jumprelu", "site": "layers.1.layer_output", "b_dec_in": False,
         "npz": "resid-jumprelu-npz"},
    ],
}

# circuit-tracer's per-layer transcoder sets. `input_hook` / `output_hook` are the config's hooks
# (TransformerLens names without `blocks.L.`); `input` / `output` the values they stand for in
# `hook_site` terms; `layers` each layer's SAELens architecture (the weights are made with SAELens
# and written in circuit-tracer's layout); `listing`: how config.yaml names the files (None: it
# lists none and the layer files lie beside it; "paths": a list of paths; "entries": the older
# {id, layer, filepath} mappings); `npz`: the layers are Gemma Scope params.npz files.
TRANSCODER_SETS = {
    "gpt2-tied": [
        {"name": "ct-gpt2-normalized", "input_hook": "ln2.hook_normalized", "output_hook": "hook_mlp_out",
         "input": "ln2_normalized", "output": "mlp_output",
         "layers": ["skip_transcoder", "jumprelu_transcoder", "skip_transcoder"], "listing": "paths"},
    ],
    "llama-gqa2-llama3-bias": [
        {"name": "ct-llama", "input_hook": "mlp.hook_in", "output_hook": "mlp.hook_out",
         "input": "mlp_input", "output": "mlp_output",
         "layers": ["skip_transcoder", "jumprelu_transcoder"], "listing": None},
    ],
    "gemma2-window-softcap": [
        {"name": "ct-gemma-scope", "input_hook": "ln2.hook_normalized", "output_hook": "hook_mlp_out",
         "input": "ln2_normalized", "output": "mlp_output",
         "layers": ["jumprelu_transcoder"] * 3, "listing": "entries", "npz": True},
    ],
}

CLASSES = {
    "standard": (StandardSAE, StandardSAEConfig),
    "topk": (TopKSAE, TopKSAEConfig),
    "jumprelu": (JumpReLUSAE, JumpReLUSAEConfig),
    "gated": (GatedSAE, GatedSAEConfig),
    "skip_transcoder": (SkipTranscoder, SkipTranscoderConfig),
    "jumprelu_transcoder": (JumpReLUTranscoder, JumpReLUTranscoderConfig),
}


def parse(site):
    """'layers.1.mlp_output' -> (1, 'mlp_output')."""
    _, layer, kind = site.split(".", 2)
    return int(layer), kind


def tl_name(site):
    layer, kind = parse(site)
    return f"blocks.{layer}.{TL_NAMES[kind]}"


def hook_site(model, site, fn):
    """Registers a hook passing the value at `site` to fn, which returns a replacement or None.

    Values: layer_input / layer_output / attention_output / mlp_output [B, T, H];
    self_attn.attention_head_outputs [B, T, NH, D] (the output projection's input, per head).
    """
    body = model.transformer if hasattr(model, "transformer") else model.model
    blocks = body.h if hasattr(body, "h") else body.layers
    layer, kind = parse(site)
    block = blocks[layer]
    attention = getattr(block, "attn", None) or getattr(block, "self_attn")
    if kind == "layer_input":
        # transformers 5 passes hidden_states positionally to most blocks; accept a keyword too.
        def pre(_module, args, kwargs):
            value = args[0] if args else kwargs["hidden_states"]
            new = fn(value)
            if new is None:
                return None
            if args:
                return (new,) + tuple(args[1:]), kwargs
            return args, {**kwargs, "hidden_states": new}

        return block.register_forward_pre_hook(pre, with_kwargs=True)
    if kind == "self_attn.attention_head_outputs":
        projection = getattr(attention, "c_proj", None) or getattr(attention, "o_proj")
        heads = model.config.num_attention_heads

        def pre_projection(_module, args):
            b, t, width = args[0].shape
            new = fn(args[0].view(b, t, heads, width // heads))
            return None if new is None else (new.reshape(b, t, width),) + tuple(args[1:])

        return projection.register_forward_pre_hook(pre_projection)
    if kind in ("mlp_input", "ln2_normalized"):
        # What the MLP reads (its pre-norm's output), or that norm's arithmetic alone on the
        # norm's input (TransformerLens' ln2.hook_normalized with fold_ln=False). Read only.
        norm = next(getattr(block, n) for n in ("pre_feedforward_layernorm", "post_attention_layernorm", "ln_2")
                    if hasattr(block, n))

        def read(module, args):
            x = args[0]
            if module is block.mlp:
                fn(x)
            elif isinstance(norm, torch.nn.LayerNorm):
                fn(torch.nn.functional.layer_norm(x, norm.normalized_shape, eps=norm.eps))
            else:
                fn(norm._norm(x.float()))

        return (block.mlp if kind == "mlp_input" else norm).register_forward_pre_hook(read)
    # mlp_output is what the block adds: after Gemma's post-feedforward norm where there is one.
    mlp_out = getattr(block, "post_feedforward_layernorm", None) or block.mlp
    module = {"layer_output": block, "attention_output": attention, "mlp_output": mlp_out}[kind]

    def post(_module, _args, output):
        value = output[0] if isinstance(output, tuple) else output
        new = fn(value)
        if new is None:
            return None
        return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new

    return module.register_forward_hook(post)


def capture(model, prompt, steps, sites):
    """Each site's value at every forward call of a clean generation, as a list over steps."""
    values = {site: [] for site in sites}
    handles = [hook_site(model, site, lambda v, s=site: values[s].append(v.detach().clone())) for site in sites]
    generate(model, prompt, steps)
    for handle in handles:
        handle.remove()
    return values


def sae_input(spec, value):
    """The dictionary's input from its input site's value: one head's slice for head-indexed ones.

    SAELens has no runtime behaviour for metadata.hook_head_index (HookedSAETransformer's wrapper
    calls sae.encode on the whole hook_z value); only its training ActivationsStore slices
    [:, :, head]. So the reference applies the SAE to x[:, :, head] itself.
    """
    return value[:, :, spec["head"]] if "head" in spec else value


def dictionary_out(sae, x, features):
    """The dictionary's output for these features: decode, plus W_skip x for a skip transcoder
    (as SkipTranscoder.forward adds it; decode alone leaves it out).

    Encodes x first: with constant_norm_rescale / layer_norm, decode divides by state that the
    last encode stored (and deletes it), so every decode must follow an encode of the same x.
    """
    sae.encode(x)
    out = sae.decode(features)
    if isinstance(sae, SkipTranscoder):
        out = out + x @ sae.W_skip.T
    return out


@torch.no_grad()
def pre_activations(sae, x):
    """(what decides which features fire, and its distance from the boundary) per token and feature."""
    arch = sae.cfg.architecture()
    sae_in = sae.process_sae_in(x)
    if arch == "gated":
        gate = sae_in @ sae.W_enc + sae.b_gate
        magnitude = sae_in @ (sae.W_enc * sae.r_mag.exp()) + sae.b_mag
        # Where the gate is open the magnitude's ReLU decides too.
        margin = torch.where(gate > 0, torch.minimum(gate.abs(), magnitude.abs()), gate.abs())
        return gate > 0, margin
    pre = sae_in @ sae.W_enc + sae.b_enc
    if arch in ("jumprelu", "jumprelu_transcoder"):
        return pre > sae.threshold, (pre - sae.threshold).abs()
    if arch == "topk":
        if sae.cfg.rescale_acts_by_decoder_norm:
            pre = pre * sae.W_dec.norm(dim=-1)
        ranked = pre.sort(dim=-1, descending=True).values
        k = sae.cfg.k
        # The cut between the k-th and (k+1)-th, and the ReLU on the top k values.
        gap = (ranked[..., k - 1] - ranked[..., k]).unsqueeze(-1)
        margin = torch.minimum(gap, ranked[..., :k].abs().min(dim=-1, keepdim=True).values).expand_as(pre)
        return sae.encode(x) > 0, margin
    return pre > 0, pre.abs()


def make_sae(spec, d_in, d_out, fixture):
    """An SAELens dictionary with default weights and the metadata that names its hooks."""
    sae_class, cfg_class = CLASSES[spec["arch"]]
    metadata = SAEMetadata(model_name=fixture, hook_name=tl_name(spec.get("input_site", spec["site"])))
    kwargs = {"d_in": d_in, "d_sae": D_SAE, "dtype": "float32", "device": "cpu", "metadata": metadata}
    if "input_site" in spec:
        metadata.hook_name_out = tl_name(spec["site"])
        kwargs.update(d_out=d_out, apply_b_dec_to_input=False)
    else:
        kwargs.update(apply_b_dec_to_input=spec.get("b_dec_in", True),
                      normalize_activations=spec.get("normalize", "none"),
                      reshape_activations=spec.get("reshape", "none"))
    if "head" in spec:
        metadata.hook_head_index = spec["head"]
    if spec["arch"] == "topk":
        kwargs.update(k=spec["k"], rescale_acts_by_decoder_norm=spec["rescale"])
    return sae_class(cfg_class(**kwargs))


def rms(t):
    return t.pow(2).mean().sqrt()


@torch.no_grad()
def fill(sae, x, y, generator):
    """Seeded random weights with biases fitted to the inputs x (and outputs y of a transcoder).

    x, y: [1, N, ...] over every token of a clean generation. Each ReLU-type feature's boundary is
    put midway between two neighbouring sorted pre-activations so that a chosen number of tokens
    fire and the nearest token is half a gap away.
    """
    arch = sae.cfg.architecture()
    randn = lambda *shape: torch.randn(*shape, generator=generator)
    uniform = lambda lo, hi, n: lo + (hi - lo) * torch.rand(n, generator=generator)
    transcoder = "transcoder" in arch
    # Zero biases first, so process_sae_in gives the (normalised, flattened) input alone.
    for name in ("b_enc", "b_gate", "b_mag", "r_mag", "threshold"):
        if isinstance(getattr(sae, name, None), torch.nn.Parameter):
            getattr(sae, name).data.zero_()
    sae.b_dec.data.zero_()
    normalised = sae.process_sae_in(x).flatten(0, -2)
    target = y.flatten(0, -2) if transcoder else normalised
    sae.b_dec.data.copy_(0.2 * rms(target) * randn(target.shape[-1]))
    if isinstance(sae, SkipTranscoder):
        sae.W_skip.data.copy_(0.3 * rms(y) / rms(x) * randn(*sae.W_skip.shape) / sae.cfg.d_in**0.5)

    # Decoder rows with different norms, scaled so the reconstruction is near half the target's size.
    sae.W_dec.data.copy_(randn(D_SAE, target.shape[-1]) * torch.exp(uniform(-0.6, 0.6, D_SAE)).unsqueeze(1))
    # Encoder: unit-variance pre-activations per feature over the tokens.
    sae.W_enc.data.copy_(randn(sae.cfg.d_in, D_SAE))
    s = sae.process_sae_in(x).flatten(0, -2) @ sae.W_enc
    sae.W_enc.data /= s.std(dim=0)
    s = s / s.std(dim=0)

    n = s.shape[0]
    ordered = s.sort(dim=0).values
    # Number of tokens each feature fires on: a random draw, nudged to the neighbour with the wider gap.
    fire = torch.randint(1, n - 2, (D_SAE,), generator=generator)
    cuts = torch.empty(D_SAE)
    for j in range(D_SAE):
        options = [c for c in (fire[j] - 1, fire[j], fire[j] + 1) if 1 <= c <= n - 1]
        gaps = [ordered[n - c, j] - ordered[n - c - 1, j] for c in options]
        c = options[int(torch.tensor(gaps).argmax())]
        cuts[j] = (ordered[n - c, j] + ordered[n - c - 1, j]) / 2
    if arch in ("standard", "skip_transcoder"):
        sae.b_enc.data.copy_(-cuts)
    elif arch in ("jumprelu", "jumprelu_transcoder"):
        threshold = uniform(0.3, 1.0, D_SAE)
        sae.threshold.data.copy_(threshold)
        sae.b_enc.data.copy_(threshold - cuts)
    elif arch == "gated":
        # Magnitudes are positive wherever the gate opens, and also just below it, where only the
        # gate keeps the feature off.
        r_mag = 0.3 * randn(D_SAE)
        sae.r_mag.data.copy_(r_mag)
        sae.b_gate.data.copy_(-cuts)
        sae.b_mag.data.copy_(-r_mag.exp() * cuts + uniform(0.1, 0.5, D_SAE))
    elif arch == "topk":
        sae.b_enc.data.copy_(0.5 + 0.3 * randn(D_SAE))

    features = sae.encode(x)
    linear = features / sae.W_dec.norm(dim=-1) if getattr(sae.cfg, "rescale_acts_by_decoder_norm", False) else features
    sae.W_dec.data *= 0.5 * rms(target) / rms(linear @ sae.W_dec)


def check(name, sae, x, where):
    """Asserts no feature sits within MARGIN of its boundary; returns (active fraction, margin)."""
    active, margin = pre_activations(sae, x)
    active = active.flatten(0, -2)
    least = float(margin.min())
    assert least > MARGIN, f"{name}: a feature is {least:.2e} from its boundary ({where})"
    per_token = active.sum(-1)
    assert (per_token > 0).all() and (per_token < D_SAE).all(), f"{name}: a token with no or all features active"
    return float(active.float().mean()), least


def gemma_scope_round_trip(path, reference):
    """Loads a Gemma Scope params.npz with SAELens's Gemma 2 loader and checks it is `reference`.

    gemma_2_sae_huggingface_loader fetches params.npz with hf_hub_download and then converts it;
    the fetch is swapped for the local path so only the reading and converting run. The repo id
    and folder name are placeholders that its config reader parses (layer, model size); the
    shapes and hook come from cfg_overrides.
    """
    real = loaders.hf_hub_download

    def local(**kwargs):
        assert kwargs["filename"] == "params.npz"
        return str(path)

    loaders.hf_hub_download = local
    try:
        cfg, state, _ = loaders.gemma_2_sae_huggingface_loader(
            repo_id="google/gemma-scope-2b-pt-res", folder_name="layer_1/width_16k/average_l0_1",
            device="cpu", cfg_overrides={"d_in": reference.cfg.d_in, "d_sae": reference.cfg.d_sae,
                                         "model_name": reference.cfg.metadata.model_name},
        )
    finally:
        loaders.hf_hub_download = real
    cfg = handle_config_defaulting(cfg)
    sae_cfg = SAE.get_sae_config_class_for_architecture(cfg["architecture"]).from_dict(cfg)
    sae = SAE.get_sae_class_for_architecture(sae_cfg.architecture())(sae_cfg)
    sae.process_state_dict_for_loading(state)
    sae.load_state_dict(state)
    assert isinstance(sae, JumpReLUSAE) and not sae.cfg.apply_b_dec_to_input
    assert sae.cfg.normalize_activations == "none"
    assert sae.cfg.metadata.hook_name == reference.cfg.metadata.hook_name
    mine = reference.state_dict()
    assert sorted(state) == sorted(mine) and all(torch.equal(state[k], mine[k]) for k in mine)
    return sae


def circuit_tracer_state(sae):
    """A SAELens transcoder's weights as circuit-tracer lays out a layer file: W_enc [F, d]
    (applied as x W_enc^T + b_enc), W_dec [F, d], the JumpReLU threshold under its module's name."""
    state = {"W_enc": sae.W_enc.T, "W_dec": sae.W_dec, "b_enc": sae.b_enc, "b_dec": sae.b_dec}
    if hasattr(sae, "threshold"):
        state["activation_function.threshold"] = sae.threshold
    if isinstance(sae, SkipTranscoder):
        state["W_skip"] = sae.W_skip
    return {key: value.detach().float().contiguous() for key, value in state.items()}


# The hookscope site each set hook's value is served at (a transcoder reading ln2.hook_normalized
# encodes residual_mid through the norm's arithmetic).
SERVED = {"mlp_input": "mlp_input", "ln2_normalized": "residual_mid", "mlp_output": "mlp_output"}


def make_set(spec, fixture, model, prompt, steps, clean_logits, directory, tensors, report):
    """One circuit-tracer transcoder set: writes its folder, keeps every layer's references as
    circuit-tracer's own loaded transcoders compute them, and returns its dictionaries.json entry
    and edit case (a feature of one layer ablated at every step)."""
    name = spec["name"]
    count = len(spec["layers"])
    ins = [f"layers.{i}.{spec['input']}" for i in range(count)]
    outs = [f"layers.{i}.{spec['output']}" for i in range(count)]
    clean = capture(model, prompt, steps, ins + outs)
    folder = directory / "dictionaries" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    files, twins = [], []
    for layer, arch in enumerate(spec["layers"]):
        x, y = torch.cat(clean[ins[layer]], dim=1), torch.cat(clean[outs[layer]], dim=1)
        sae_class, cfg_class = CLASSES[arch]
        metadata = SAEMetadata(model_name=fixture, hook_name=f"blocks.{layer}.{spec['input_hook']}")
        metadata.hook_name_out = f"blocks.{layer}.{spec['output_hook']}"
        sae = sae_class(cfg_class(d_in=x.shape[-1], d_sae=D_SAE, d_out=y.shape[-1], dtype="float32",
                                  device="cpu", apply_b_dec_to_input=False, metadata=metadata))
        for attempt in range(20):
            fill(sae, x, y, torch.Generator().manual_seed(7000 + 100 * layer + attempt))
            try:
                check(f"{name} layer {layer}", sae, x, "clean generation")
                break
            except AssertionError as error:
                print(f"  reseeding {name} layer {layer}: {error}")
        else:
            raise AssertionError(f"{name} layer {layer}: no seed fits")
        if spec.get("npz"):
            file = f"layer_{layer}/params.npz"
            (folder / f"layer_{layer}").mkdir()
            np.savez(folder / file, **{k: getattr(sae, k).detach().numpy().astype(np.float32)
                                       for k in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")})
        else:
            file = f"layer_{layer}.safetensors"
            save_file(circuit_tracer_state(sae), folder / file)
        files.append(file)
        twins.append(sae)
    config = {"model_kind": "transcoder_set", "feature_input_hook": spec["input_hook"],
              "feature_output_hook": spec["output_hook"]}
    if spec["listing"] == "paths":
        config["transcoders"] = files
    elif spec["listing"] == "entries":
        config["transcoders"] = [{"id": f"{name}-{i}", "layer": i, "filepath": f} for i, f in enumerate(files)]
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    # Loaded as circuit-tracer loads them: 0.5's path resolution for a list of paths (relative to
    # the working directory, so from the folder), the earlier releases' {layer, filepath} reading
    # for mappings, and the layer files as its hub path finds them for a config listing none.
    written = yaml.safe_load((folder / "config.yaml").read_text())
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        if spec["listing"] == "paths":
            paths = resolve_transcoder_paths(written)
        elif spec["listing"] == "entries":
            paths = {entry["layer"]: entry["filepath"] for entry in written["transcoders"]}
        else:
            paths = {i: f"layer_{i}.safetensors" for i in range(count)}
        transcoders = load_transcoder_set(
            paths, scan=name, feature_input_hook=written["feature_input_hook"],
            feature_output_hook=written["feature_output_hook"], device=torch.device("cpu"),
            dtype=torch.float32, special_load_fn="gemma-scope" if spec.get("npz") else None,
            lazy_encoder=False, lazy_decoder=False)
    finally:
        os.chdir(cwd)

    layers = []
    with torch.no_grad():
        for layer, transcoder in enumerate(transcoders):
            x, y = clean[ins[layer]][0], clean[outs[layer]][0]
            features = transcoder.encode(x)
            reconstruction = transcoder.decode(features, x)
            twin = twins[layer]
            assert torch.allclose(features, twin.encode(x), atol=1e-6), f"{name} {layer}: features"
            assert torch.allclose(reconstruction, dictionary_out(twin, x, features), atol=1e-5)
            for key, value in (("features", features), ("reconstruction", reconstruction),
                               ("error", y - reconstruction)):
                tensors[f"{name}/layer{layer}/{key}"] = value.float().contiguous()
            layers.append({"site": f"layers.{layer}.{SERVED[spec['output']]}",
                           "input_site": f"layers.{layer}.{SERVED[spec['input']]}"})
            report[f"{name} layer {layer}"] = {"active_fraction": round(float((features > 0).float().mean()), 3)}

    # A feature of one layer ablated at every step: the output site replaced by
    # decode(edited features) + (value - decode(features)), circuit-tracer's transcoder in torch hooks.
    layer = min(1, count - 1)
    transcoder = transcoders[layer]
    with torch.no_grad():
        features = transcoder.encode(clean[ins[layer]][0])[0]
    feature = int(((features > 0).sum(0) * 1e3 + features.mean(0)).argmax())
    held, margins = {}, []

    def replace(value):
        x = held.pop("x")
        margins.append(pre_activations(twins[layer], x)[1].min())
        features = transcoder.encode(x)
        edited = features.clone()
        edited[..., feature] = 0
        return transcoder.decode(edited, x) + (value - transcoder.decode(features, x))

    handles = [hook_site(model, ins[layer], lambda v: held.__setitem__("x", v)),
               hook_site(model, outs[layer], replace)]
    ids, logits = generate(model, prompt, steps)
    for handle in handles:
        handle.remove()
    least = float(torch.stack(margins).min())
    assert least > MARGIN, f"{name}: a feature is {least:.2e} from its boundary in a generation"
    change = float((logits - clean_logits).abs().max())
    assert change > 1e-3, f"{name}: the ablation does not change the logits ({change:.1e})"
    case = f"{name}-ablate"
    tensors[f"{case}/output_ids"] = ids
    tensors[f"{case}/logits"] = logits
    report[case] = {"logit_change": round(change, 4), "margin": least, "ids": ids[len(prompt):].tolist()}
    site = layers[layer]["site"]
    entry = {"name": name, "folder": f"dictionaries/{name}", "format": "circuit_tracer",
             "d_sae": D_SAE, "layers": layers}
    return entry, {"name": case, "dictionary": name, "site": site, "feature": feature,
                   "zero": [f"{site}.sae.features[:, :, {feature}]@all"]}


def make(fixture):
    directory = FIXTURES / fixture
    prompt = json.loads((directory / "reference.json").read_text())["prompts"][0]
    model = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager", dtype=torch.float32).eval()
    steps = Steps(model)
    specs = DICTIONARIES[fixture]
    sites = sorted({s for spec in specs for s in (spec["site"], spec.get("input_site", spec["site"]))})
    clean = capture(model, prompt, steps, sites)
    clean_ids, clean_logits = generate(model, prompt, steps)
    tensors, entries, saes, report = {}, [], {}, {}

    for index, spec in enumerate(specs):
        name = spec["name"]
        inputs = sae_input(spec, torch.cat(clean[spec.get("input_site", spec["site"])], dim=1))
        outputs = torch.cat(clean[spec["site"]], dim=1)
        d_in = inputs[0, 0].numel()
        sae = make_sae(spec, d_in, outputs.shape[-1], fixture)
        for attempt in range(20):
            fill(sae, inputs, outputs, torch.Generator().manual_seed(1000 * (index + 1) + attempt))
            try:
                check(name, sae, inputs, "clean generation")
                break
            except AssertionError as error:
                print(f"  reseeding {name}: {error}")
        else:
            raise AssertionError(f"{name}: no seed fits")
        folder = directory / "dictionaries" / name
        sae.save_model(folder)
        loaded = SAE.load_from_disk(folder)
        assert type(loaded) is type(sae)

        # The prompt call's features, reconstruction and error, with the model unedited.
        with torch.no_grad():
            x = sae_input(spec, clean[spec.get("input_site", spec["site"])][0])
            y = sae_input(spec, clean[spec["site"]][0])
            features = sae.encode(x)
            reconstruction = sae(x)
            assert torch.equal(reconstruction, dictionary_out(sae, x, features))
            assert torch.equal(loaded.encode(x), features) and torch.equal(loaded(x), reconstruction)
        fraction, margin = check(name, sae, x, "prompt call")
        report[name] = {"active_fraction": round(fraction, 3), "margin": margin}
        for key, value in (("features", features), ("reconstruction", reconstruction), ("error", y - reconstruction)):
            tensors[f"{name}/{key}"] = value.float().contiguous()
        entry = {"name": name, "folder": f"dictionaries/{name}", "site": spec["site"]}
        if "input_site" in spec:
            entry["input_site"] = spec["input_site"]
        if "head" in spec:
            entry["hook_head_index"] = spec["head"]
        entry.update(format="sae_lens", architecture=sae.cfg.architecture(), d_sae=D_SAE)
        entries.append(entry)
        saes[name] = (spec, sae)

        # The same weights in Gemma Scope's layout: params.npz alone, no cfg.json.
        if "npz" in spec:
            twin = directory / "dictionaries" / spec["npz"]
            twin.mkdir(parents=True, exist_ok=True)
            np.savez(twin / "params.npz", **{k: getattr(sae, k).detach().numpy().astype(np.float32)
                                              for k in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")})
            # The npz's references and edits come from the SAE that SAELens's loader made of it.
            converted = gemma_scope_round_trip(twin / "params.npz", sae)
            with torch.no_grad():
                assert torch.equal(converted.encode(x), features) and torch.equal(converted(x), reconstruction)
            for key in ("features", "reconstruction", "error"):
                tensors[f"{spec['npz']}/{key}"] = tensors[f"{name}/{key}"].clone()
            entries.append({**entry, "name": spec["npz"], "folder": f"dictionaries/{spec['npz']}",
                            "format": "gemma_scope_npz"})
            saes[spec["npz"]] = (spec, converted)
            report[spec["npz"]] = report[name]

    cases = []

    def run(dictionary, edit, splice=False):
        """A generation with `dictionary` attached: its site value replaced at every step by
        out(edit(features, step)) + (value - out(features)), or by out(features) for a splice."""
        spec, sae = saes[dictionary]
        held, margins = {}, []

        def replace(value):
            x = held.pop("x") if "input_site" in spec else sae_input(spec, value)
            y = sae_input(spec, value)
            margins.append(pre_activations(sae, x)[1].min())
            features = sae.encode(x)
            clean_out = dictionary_out(sae, x, features)
            if splice:
                new = clean_out
            else:
                new = dictionary_out(sae, x, edit(features.clone(), steps.step)) + (y - clean_out)
            if "head" in spec:
                whole = value.clone()
                whole[:, :, spec["head"]] = new
                return whole
            return new

        handles = [hook_site(model, spec["site"], replace)]
        if "input_site" in spec:
            handles.append(hook_site(model, spec["input_site"], lambda v: held.__setitem__("x", v)))
        ids, logits = generate(model, prompt, steps)
        for handle in handles:
            handle.remove()
        least = float(torch.stack(margins).min())
        assert least > MARGIN, f"{dictionary}: a feature is {least:.2e} from its boundary in a generation"
        return ids, logits, least

    def record(case, dictionary, edit, spec, splice=False):
        # With a no-op edit the hooked generation is the unhooked one.
        ids, logits, _ = run(dictionary, lambda f, _step: f)
        assert torch.equal(ids, clean_ids), f"{case}: no-op edit changed the tokens"
        assert (logits - clean_logits).abs().max() < 1e-5, f"{case}: no-op edit moved the logits"
        ids, logits, least = run(dictionary, edit, splice)
        change = float((logits - clean_logits).abs().max())
        assert change > 1e-3, f"{case}: the edit does not change the logits ({change:.1e})"
        tensors[f"{case}/output_ids"] = ids
        tensors[f"{case}/logits"] = logits
        site = saes[dictionary][0]["site"]
        cases.append({"name": case, "dictionary": dictionary, "site": site, **spec})
        report[case] = {"logit_change": round(change, 4), "margin": least, "ids": ids[len(prompt):].tolist()}

    def busiest(dictionary):
        """The feature active on most prompt tokens (ties: the largest mean activation)."""
        _, sae = saes[dictionary]
        spec = saes[dictionary][0]
        features = sae.encode(sae_input(spec, clean[spec.get("input_site", spec["site"])][0]))[0]
        score = (features > 0).sum(0) * 1e3 + features.mean(0)
        return int(score.argmax())

    def zero(feature):
        def edit(features, _step):
            features[..., feature] = 0
            return features
        return edit

    if fixture == "gpt2-tied":
        f = busiest("resid-standard")
        record("sae-ablate", "resid-standard", zero(f),
               {"feature": f, "zero": [f"layers.1.layer_input.sae.features[:, :, {f}]@all"]})
        # A feature that fires on few prompt tokens, so the addition is mostly new.
        topk = saes["resid-topk"][1]
        active = (topk.encode(clean["layers.0.layer_output"][0])[0] > 0).sum(0)
        g = int(active.argmin())

        def add(features, step):
            if step == 0:
                features[..., g] += 4.0
            return features

        record("sae-add", "resid-topk", add,
               {"feature": g, "add": [f"layers.0.layer_output.sae.features[:, :, {g}]@0=4.0"]})
        h = busiest("transcoder-skip")
        record("transcoder-ablate", "transcoder-skip", zero(h),
               {"feature": h, "zero": [f"layers.1.mlp_output.sae.features[:, :, {h}]@all"]})
        record("sae-splice", "resid-standard", None, {"splice": True}, splice=True)
    elif fixture == "llama-gqa2-llama3-bias":
        j = busiest("resid-jumprelu")
        record("sae-ablate", "resid-jumprelu", zero(j),
               {"feature": j, "zero": [f"layers.1.layer_output.sae.features[:, :, {j}]@all"]})
    elif fixture == "gemma2-window-softcap":
        k = busiest("resid-jumprelu-npz")
        record("sae-ablate-npz", "resid-jumprelu-npz", zero(k),
               {"feature": k, "zero": [f"layers.1.layer_output.sae.features[:, :, {k}]@all"]})

    for spec in TRANSCODER_SETS.get(fixture, []):
        entry, case = make_set(spec, fixture, model, prompt, steps, clean_logits, directory, tensors, report)
        entries.append(entry)
        cases.append(case)

    save_file({key: value.contiguous() for key, value in tensors.items()}, directory / "dictionaries.safetensors")
    meta = {"prompt": prompt, "new_tokens": NEW_TOKENS, "dictionaries": entries, "cases": cases}
    (directory / "dictionaries.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{fixture}: {len(entries)} dictionaries, {len(cases)} cases")
    for key, value in report.items():
        print(f"  {key}: {value}")


def main():
    torch.manual_seed(0)
    for fixture in DICTIONARIES:
        make(fixture)


if __name__ == "__main__":
    main()
