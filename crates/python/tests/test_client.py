"""hookscope.Client against `hookscope serve` on the embedded model: the same `trace`,
`generate` and `sites` results as the local Model, and the server's refusals as ServerError."""

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


def test_refusals_are_server_errors(served):
    with pytest.raises(hookscope.ServerError, match="401"):
        hookscope.Client(served).trace("In the beginning")
    client = hookscope.Client(served, token="t0k")
    with pytest.raises(hookscope.ServerError, match="layers.99"):
        client.trace("In the beginning", save=["layers.99.layer_output"])
    assert client.model()["architecture"] == "llama"
