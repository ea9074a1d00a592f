"""Gradients from Python (issue 36): `Model(gradients=True).trace(grad=..., save_grad=...)`
gives the metric and each site's gradient; the gradient predicts how the metric moves when the
site moves a little (a finite difference through `add=`), and a model loaded without
gradients refuses, naming `gradients=True`."""

import numpy as np
import pytest

import hookscope

PROMPT = "Speak unto the children of"
METRIC = "logit-diff: Israel, the"


@pytest.fixture(scope="module")
def model():
    return hookscope.Model(gradients=True)


def test_the_gradient_predicts_a_small_steer(model):
    run = model.trace(PROMPT, grad=METRIC, save_grad=["layers.*.layer_output"])
    assert sorted(run.grads) == [f"layers.{i}.layer_output@0" for i in range(4)]
    plain = hookscope.Model().trace(PROMPT, save=["logits[:, -1]"])
    logits = plain.saved["logits[:, -1]@0"][0]
    israel, the = model.encode(" Israel")[0], model.encode(" the")[0]
    assert run.metric == pytest.approx(logits[israel] - logits[the], abs=1e-4)

    gradient = run.grads["layers.2.layer_output@0"]
    direction = np.random.default_rng(0).standard_normal(gradient.shape).astype(np.float32)
    epsilon = 1e-2
    moved = model.trace(PROMPT, add={"layers.2.layer_output": epsilon * direction},
                        grad=METRIC)
    predicted = epsilon * float((gradient * direction).sum())
    assert moved.metric - run.metric == pytest.approx(predicted, rel=0.05, abs=1e-4)


def test_gradients_need_a_model_loaded_for_them(model):
    with pytest.raises(hookscope.InputError, match="autodiff"):
        hookscope.Model().trace(PROMPT, grad=METRIC, save_grad=["layers.0.layer_output"])
    with pytest.raises(hookscope.InputError, match="grad="):
        model.trace(PROMPT, save_grad=["layers.0.layer_output"])
    with pytest.raises(hookscope.InputError, match="metric `kl`"):
        model.trace(PROMPT, grad="kl")
