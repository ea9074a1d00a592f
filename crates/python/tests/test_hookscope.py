"""hookscope from Python: the seed's examples, parity with the committed fixtures, errors as
exceptions, and writes matching the CLI's."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import hookscope

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "conformance" / "fixtures"
PROMPT = "The Eiffel Tower is in the city of"


@pytest.fixture(scope="module")
def default():
    return hookscope.Model()


def test_shapes_per_step_and_argmax_is_the_appended_token(default):
    g = default.generate(PROMPT, max_new_tokens=3, greedy=True, save=["layers.1.layer_output", "next_token_probs"])
    t0 = g.output_ids.shape[1] - 3
    shapes = [g.saved[f"layers.1.layer_output@{k}"].shape for k in range(3)]
    assert shapes == [(1, t0, 64), (1, 1, 64), (1, 1, 64)]
    argmax = [int(g.saved[f"next_token_probs@{k}"].argmax(-1)[0]) for k in range(3)]
    assert argmax == g.output_ids[0, -3:].tolist()
    assert g.output_ids.dtype == np.int64 and g.attention_mask is None
    assert g.text[0].startswith(PROMPT) and g.text[0] == PROMPT + g.new_text[0]
    assert g.steps == 3


def test_a_decode_steps_values(default):
    g = default.generate(
        PROMPT,
        max_new_tokens=3,
        save=[
            "input_ids@1",
            "layers.1.self_attn.attention_keys@1",
            "layers.1.self_attn.attention_probabilities@1",
            "layers.1.layer_output[:, -1]@1",
        ],
    )
    t0 = g.output_ids.shape[1] - 3
    assert g.saved["input_ids@1"].tolist() == [[int(g.output_ids[0, t0])]]
    assert g.saved["layers.1.self_attn.attention_keys@1"].shape == (1, 2, t0 + 1, 16)
    assert g.saved["layers.1.self_attn.attention_probabilities@1"].shape == (1, 4, 1, t0 + 1)
    assert g.saved["layers.1.layer_output[:, -1]@1"].shape == (1, 64)


def test_a_zero_write_at_step_1_keeps_step_0s_token(default):
    plain = default.generate(PROMPT, max_new_tokens=3, greedy=True)
    zeroed = default.generate(PROMPT, max_new_tokens=3, greedy=True, zero=["layers.1.layer_output@1"])
    assert zeroed.output_ids[0, -3] == plain.output_ids[0, -3]
    assert zeroed.output_ids[0, -2:].tolist() != plain.output_ids[0, -2:].tolist()


def test_saved_values_match_the_committed_transformers_reference():
    fixture = FIXTURES / "gpt2-tied"
    prompt = json.loads((fixture / "reference.json").read_text())["prompts"][0]
    reference = load_file(str(fixture / "reference.safetensors"))
    model = hookscope.Model(str(fixture))
    sites = ["layers.*.layer_output", "layers.*.self_attn.attention_probabilities", "logits"]
    t = model.trace([prompt], save=sites)
    assert len(t.saved) == 7
    for key, value in t.saved.items():
        expected = reference[f"prompt0/{key}"]
        assert value.shape == expected.shape, key
        assert np.abs(value - expected).max() < 1e-4, key


def test_sae_features_match_the_sae_lens_reference_and_edits_flow_on():
    fixture = FIXTURES / "gpt2-tied"
    meta = json.loads((fixture / "dictionaries.json").read_text())
    reference = load_file(str(fixture / "dictionaries.safetensors"))
    sae = str(fixture / "dictionaries" / "resid-standard")
    model = hookscope.Model(str(fixture), sae=[f"layers.1.layer_input={sae}"])
    site = "layers.1.layer_input.sae"
    t = model.trace([meta["prompt"]], save=[f"{site}.features", f"{site}.error", "logits"])
    for part in ["features", "error"]:
        expected = reference[f"resid-standard/{part}"]
        assert np.abs(t.saved[f"{site}.{part}@0"] - expected).max() < 1e-5, part
    plain = hookscope.Model(str(fixture)).trace([meta["prompt"]], save=["logits"])
    assert np.array_equal(t.saved["logits@0"], plain.saved["logits@0"])
    ablated = model.trace([meta["prompt"]], save=["logits"], zero=[f"{site}.features[:, :, 18]"])
    assert np.abs(ablated.saved["logits@0"] - plain.saved["logits@0"]).max() > 1e-3
    # attach() gives a new model sharing the weights; the original stays as it was.
    base = hookscope.Model(str(fixture))
    attached = base.attach([sae])
    again = attached.trace([meta["prompt"]], save=[f"{site}.features"])
    assert np.array_equal(again.saved[f"{site}.features@0"], t.saved[f"{site}.features@0"])
    with pytest.raises(hookscope.Error, match="no dictionary is attached"):
        base.trace([meta["prompt"]], save=[f"{site}.features"])
    with pytest.raises(hookscope.Error, match="d_in"):
        llama = FIXTURES / "llama-gqa2-llama3-bias" / "dictionaries" / "resid-jumprelu"
        hookscope.Model(str(fixture), sae=[str(llama)])


def test_weights_load_in_the_chosen_precision():
    fixture = str(FIXTURES / "gpt2-tied")
    full = hookscope.Model(fixture)
    half = hookscope.Model(fixture, dtype="bf16")
    assert (full.dtype, half.dtype) == ("float32", "bfloat16")
    ids = [[1, 2, 3, 4, 5]]
    a = full.trace(ids, save=["logits"]).saved["logits@0"]
    b = half.trace(ids, save=["logits"]).saved["logits@0"]
    assert b.dtype == np.float32
    assert 0 < np.abs(a - b).max() < 0.05
    fast = hookscope.Model(fixture, dtype="bf16", matmul_precision="bfloat16")
    c = fast.trace(ids, save=["logits"]).saved["logits@0"]
    assert 0 < np.abs(c - b).max() < 0.05
    with pytest.raises(hookscope.LoadError, match="need weights stored in bf16"):
        hookscope.Model(fixture, matmul_precision="bf16")
    with pytest.raises(hookscope.InputError, match="not a matmul precision"):
        hookscope.Model(fixture, matmul_precision="int8")


def test_batches_are_left_padded_with_a_mask(default):
    t = default.trace(["Hello", "The Eiffel Tower is in"], save=["logits[:, -1]"])
    assert t.attention_mask is not None and t.attention_mask[0, 0] == 0
    assert t.saved["logits[:, -1]@0"].shape == (2, 50257)
    alone = default.trace("Hello", save=["logits[:, -1]"])
    assert np.abs(alone.saved["logits[:, -1]@0"][0] - t.saved["logits[:, -1]@0"][0]).max() < 1e-4


def test_errors_are_exceptions_with_the_clis_messages(default):
    with pytest.raises(hookscope.SiteError, match="layers.1.layer_output"):
        default.trace(PROMPT, save=["layers.1.layer_outptu"])
    with pytest.raises(hookscope.SiteError, match="index 9 is out of bounds for axis 2 with size 4"):
        default.trace(PROMPT, zero=["layers.0.self_attn.attention_head_outputs[:, :, 9]"])
    with pytest.raises(hookscope.SiteError, match=r"does not broadcast to the selected value's \[B, T, 64\]"):
        default.trace(PROMPT, add={"layers.0.layer_output": np.ones(31)})
    with pytest.raises(hookscope.WriteError, match="does not broadcast"):
        default.trace(PROMPT, set={"layers.0.layer_output": np.ones((2, 64))})
    with pytest.raises(hookscope.SiteError, match="single trace"):
        default.trace(PROMPT, save=["logits@2"])
    with pytest.raises(hookscope.InputError, match="pass greedy=False or drop top_k"):
        default.generate(PROMPT, max_new_tokens=2, greedy=True, top_k=5)
    with pytest.raises(hookscope.LoadError):
        hookscope.Model("/nonexistent/model")
    with pytest.raises(hookscope.InputError, match="`int8` is not a weight dtype"):
        hookscope.Model(dtype="int8")
    with pytest.raises(hookscope.InputError, match="--features cuda"):
        hookscope.Model(device="cuda:0")
    with pytest.raises(hookscope.InputError, match="expected cpu, wgpu"):
        hookscope.Model(device="tpu")
    assert hookscope.Model(device="cpu", dtype="float32").dtype == "float32"
    assert issubclass(hookscope.SiteError, hookscope.Error)


def test_steering_and_patching_match_the_cli(default, binary, tmp_path):
    steer = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    patch = np.random.default_rng(1).standard_normal((1, 2, 64)).astype(np.float32)
    save_file({"steer": steer, "patch": patch}, str(tmp_path / "ops.safetensors"))
    out = tmp_path / "cli.safetensors"
    ops = tmp_path / "ops.safetensors"
    subprocess.run(
        [binary, "run", "--prompt", PROMPT, "--max-new-tokens", "3", "--greedy",
         "--add", f"layers.0.layer_output@all={ops}:steer*3",
         "--set", f"layers.1.layer_output[:, 1:3]@0={ops}:patch",
         "--save", "logits", "--out", str(out)],
        check=True, capture_output=True,
    )
    cli = load_file(str(out))
    py = default.generate(
        PROMPT, max_new_tokens=3, greedy=True, save=["logits"],
        add={"layers.0.layer_output@all": steer * 3}, set={"layers.1.layer_output[:, 1:3]@0": patch},
    )
    assert py.output_ids.tolist() == cli["output_ids"].tolist()
    for k in range(3):
        assert np.abs(py.saved[f"logits@{k}"] - cli[f"logits@{k}"]).max() < 1e-5


def test_array_likes_are_accepted(default):
    base = default.trace(PROMPT, save=["layers.0.layer_output"])
    shifted = default.trace(PROMPT, save=["layers.0.layer_output"], add={"layers.0.layer_output": [0.5] * 64})
    delta = shifted.saved["layers.0.layer_output@0"] - base.saved["layers.0.layer_output@0"]
    assert np.allclose(delta, 0.5, atol=1e-5)
    torch = pytest.importorskip("torch")
    via_torch = default.trace(PROMPT, save=["layers.0.layer_output"], add={"layers.0.layer_output": torch.full((64,), 0.5)})
    assert np.allclose(via_torch.saved["layers.0.layer_output@0"], shifted.saved["layers.0.layer_output@0"])


def test_sites_lists_the_shape_table(default):
    sites = default.sites(prompt_len=5, step=2)
    first = sites[0]
    assert first == {"name": "input_ids", "shape": "[B, T]", "step0": [1, 5], "decode": [1, 1]}
    keys = next(s for s in sites if s["name"] == "layers.0.self_attn.attention_keys")
    assert keys["decode"] == [1, 2, 7, 16]
    assert "Model(llama, 4 layers" in repr(default)
    assert default.decode(default.encode(PROMPT)) == PROMPT


def test_an_interrupt_stops_a_generation_between_steps(default):
    import _thread
    import signal

    # Python's own SIGINT handler, whatever this process inherited: a shell starts background
    # jobs with SIGINT ignored, and `interrupt_main` then does nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    started = []

    def interrupt_at_step_3(step):
        started.append(step)
        if step == 3:
            # What Ctrl-C does in a notebook: the main thread's interrupt flag, set while the
            # generation runs; raised from inside it, so nothing races the generation.
            _thread.interrupt_main()

    try:
        with pytest.raises(KeyboardInterrupt):
            default.generate("And", max_new_tokens=120, greedy=True, on_step=interrupt_at_step_3)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert started == [0, 1, 2, 3]


def test_an_exception_in_on_step_stops_the_generation(default):
    def fail_at_step_1(step):
        if step == 1:
            raise ValueError("stop here")

    with pytest.raises(ValueError, match="stop here"):
        default.generate("And", max_new_tokens=5, greedy=True, on_step=fail_at_step_1)


def test_dla_matches_a_decomposition_of_the_transformers_reference():
    """On the GPT-2 fixture, every part's attribution equals the part (as transformers computed
    it: head writes, MLP outputs, the embeddings) through ln_f with the run's standard
    deviation frozen and the tied head's rows; the parts and biases sum to the logit."""
    directory = FIXTURES / "gpt2-tied"
    model = hookscope.Model(str(directory))
    prompt = json.loads((directory / "reference.json").read_text())["prompts"][0]
    reference = load_file(str(directory / "reference.safetensors"))
    weights = load_file(str(directory / "model.safetensors"))
    target, vs = 5, 17
    got = model.dla([prompt], target, vs=vs)
    at = lambda site: reference[f"prompt0/{site}@0"][0, -1]
    residual = at("layers.2.layer_output")
    scale = np.sqrt(residual.var() + 1e-5)
    unembed = weights["transformer.wte.weight"][target] - weights["transformer.wte.weight"][vs]
    weight = weights["transformer.ln_f.weight"]
    through = lambda part: float(unembed @ (weight * (part - part.mean()) / scale))
    assert got["embeddings"] == pytest.approx(through(at("layers.0.layer_input")), abs=1e-4)
    for layer in got["layers"]:
        i = layer["layer"]
        heads = at(f"layers.{i}.self_attn.attention_head_writes")
        assert layer["heads"] == pytest.approx([through(h) for h in heads], abs=1e-4)
        assert layer["mlp"] == pytest.approx(through(at(f"layers.{i}.mlp_output")), abs=1e-4)
    bias = float(unembed @ weights["transformer.ln_f.bias"])
    assert got["final_norm_bias"] == pytest.approx(bias, abs=1e-4)
    logits = reference["prompt0/logits@0"][0, -1]
    assert got["logit"] == pytest.approx(float(logits[target] - logits[vs]), abs=1e-4)
    assert got["sum"] == pytest.approx(got["logit"], abs=1e-4)
    with pytest.raises(hookscope.InputError, match="one-token string"):
        model.dla([prompt], 1.5)
