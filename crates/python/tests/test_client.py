"""hookscope.Client against `hookscope serve` on the embedded model: the same `trace`,
`generate`, `sites` and `dla` results as the local Model, the analyses equal to what the local
Model computes, and the server's refusals as ServerError."""

import subprocess

import numpy as np
import pytest

import hookscope

PROMPTS = ["In the beginning God", "And the earth was"]


@pytest.fixture(scope="module")
def served(binary):
    server = subprocess.Popen([binary, "serve", "--addr", "127.0.0.1:0", "--token", "t0k"],
                              stderr=subprocess.PIPE, text=True)
    line = server.stderr.readline()
    url = "http://" + line.split("http://")[1].split("/")[0]
    yield url
    server.terminate()
    assert server.wait(timeout=60) == 0


@pytest.fixture(scope="module")
def local():
    return hookscope.Model()


def test_client_results_equal_the_local_models(served, local):
    client = hookscope.Client(served, token="t0k")
    assert client.sites(prompt_len=4, step=2) == local.sites(prompt_len=4, step=2)
    steer = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    kwargs = dict(save=["layers.1.layer_output", "layers.0.self_attn.attention_probabilities[:, 1]"],
                  zero=["layers.0.self_attn.attention_head_outputs[:, :, 2]"],
                  add={"layers.0.layer_output": steer, "layers.1.mlp_output[:, -1]": 0.25})
    for remote, mine in [
        (client.trace(PROMPTS, **kwargs), local.trace(PROMPTS, **kwargs)),
        (client.generate(PROMPTS, 3, greedy=True, **kwargs), local.generate(PROMPTS, 3, greedy=True, **kwargs)),
    ]:
        assert sorted(remote.saved) == sorted(mine.saved)
        for key, value in mine.saved.items():
            np.testing.assert_array_equal(remote.saved[key], value, err_msg=key)
        np.testing.assert_array_equal(remote.output_ids, mine.output_ids)
        np.testing.assert_array_equal(remote.attention_mask, mine.attention_mask)
        assert (remote.text, remote.new_text, remote.steps) == (mine.text, mine.new_text, mine.steps)


def test_analyses_equal_the_local_models(served, local):
    client = hookscope.Client(served, token="t0k")
    prompt = "Speak unto the children of"
    remote, mine = client.dla(prompt, " Israel", vs=" the"), local.dla(prompt, " Israel", vs=" the")
    assert remote.keys() == mine.keys()
    assert (remote["target"], remote["vs"]) == (mine["target"], mine["vs"])
    np.testing.assert_allclose(remote["logit"], mine["logit"], atol=1e-5)
    for a, b in zip(remote["layers"], mine["layers"]):
        np.testing.assert_allclose(a["heads"], b["heads"], atol=1e-5)
        np.testing.assert_allclose(a["mlp"], b["mlp"], atol=1e-5)
    assert client.dla(local.encode(prompt), int(mine["target"]))["target"] == mine["target"]

    patterns = client.attention(prompt)
    saved = local.trace(prompt, save=["layers.*.self_attn.attention_probabilities"]).saved
    assert len(patterns["layers"]) == 4 and len(patterns["tokens"]) == len(local.encode(prompt))
    for layer, heads in patterns["layers"].items():
        expected = saved[f"layers.{layer}.self_attn.attention_probabilities@0"][0]
        np.testing.assert_allclose(heads, expected, atol=1e-6)
    assert list(client.attention(prompt, layers=[3])["layers"]) == [3]

    lens = client.lens(prompt, top_k=2)
    assert len(lens["layers"]) == 4 and len(lens["layers"][0]["positions"][0]["top"]) == 2
    sweep = client.patch(prompt, "Speak unto the daughters of", "layers.*.layer_output",
                         "logit-diff: Israel, the")
    assert [row["site"] for row in sweep["sites"]] == [f"layers.{i}.layer_output" for i in range(4)]
    assert sweep["sites"][-1]["scores"][-1] == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(hookscope.ServerError, match="no dictionary"):
        client.features(prompt)


def test_refusals_are_server_errors(served):
    with pytest.raises(hookscope.ServerError, match="401"):
        hookscope.Client(served).trace("In the beginning")
    client = hookscope.Client(served, token="t0k")
    with pytest.raises(hookscope.ServerError, match="layers.99"):
        client.trace("In the beginning", save=["layers.99.layer_output"])
    assert client.model()["architecture"] == "llama"
