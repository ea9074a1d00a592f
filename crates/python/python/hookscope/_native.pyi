"""Type stubs for hookscope's native module."""

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

ArrayLike = npt.ArrayLike
Prompts = str | Sequence[str] | Sequence[Sequence[int]]

class Error(Exception):
    """Any hookscope error (the CLI's message)."""

class LoadError(Error):
    """A model, checkpoint, config, tokenizer or file that cannot be used."""

class SiteError(Error):
    """A site, pattern, index or steps request that does not fit the model or the run."""

class WriteError(Error):
    """A written value of the wrong shape or kind, or an edit that failed."""

class InputError(Error):
    """Prompts, options or values that cannot be run."""

class Run:
    """What `Model.trace` and `Model.generate` return."""

    saved: dict[str, np.ndarray]
    """Saved values by key `SITE[INDEX]@STEP`: float32 arrays (int64 for `input_ids`)."""
    output_ids: npt.NDArray[np.int64]
    """`[B, T0 + N]`: the left-padded prompts and the generated tokens."""
    attention_mask: npt.NDArray[np.int64] | None
    """`[B, T0 + N]`, 1 at real tokens, for a padded batch; None otherwise."""
    text: list[str]
    """Each row's prompt and continuation, padding skipped."""
    new_text: list[str]
    """Each row's continuation only (empty strings for a trace)."""
    steps: int
    """Calls made: 1 for a trace; for a generation, the tokens appended."""
    grads: dict[str, np.ndarray]
    """Gradients of `trace(grad=...)`'s metric by key `SITE[INDEX]@0` (empty without it)."""
    metric: float | None
    """The value of `trace(grad=...)`'s metric, else None."""

class Model:
    """A loaded model."""

    def __init__(
        self,
        model: str | None = None,
        *,
        dtype: str | None = None,
        matmul_precision: str | None = None,
        device: str | None = None,
        sae: Sequence[str] | None = None,
        sae_without_error: bool = False,
        gradients: bool = False,
    ) -> None:
        """Load a local Hugging Face directory, a hub id, or (None) the embedded default model.
        `dtype` is the precision the weights are stored in: "auto" (or None: the config's
        `dtype`, else the checkpoint's, as transformers does), "float32", "bfloat16" or
        "float16" (also "f32", "bf16", "f16"). Products accumulate in float32 and saved values
        are float32 whatever the storage. `matmul_precision`: "float32" (None: exact products
        of the stored weights) or "bfloat16" (with bfloat16 weights, on the CPU: activations
        rounded to bfloat16 on their way into each product, about twice as fast on prompt calls
        with AVX-512 BF16). `device`: "cpu" (None), or "wgpu[:N]", "vulkan[:N]",
        "cuda[:N]", "ndarray" where the package was built with that backend's feature; a
        device the build or machine lacks raises InputError saying which feature to enable.
        `sae`: feature dictionaries to attach, each "[SITE=]PATH" (a SAELens folder, a Gemma
        Scope params.npz): their values become sites, SITE.sae.features [B, T, F],
        SITE.sae.reconstruction and SITE.sae.error, to save and edit like any other; with no
        edit the model runs unchanged. `sae_without_error`: replace those sites by the
        reconstruction alone. `gradients`: load for `trace(grad=...)` (every product runs as
        autodiff-recording tensor operations: slower, f32)."""

    def attach(self, sae: Sequence[str], *, without_error: bool = False) -> "Model":
        """A new Model sharing this one's weights, with feature dictionaries attached (each
        "[SITE=]PATH" as for `sae=`); this model is unchanged."""

    @property
    def dtype(self) -> str:
        """The precision the weights are stored in: "float32", "bfloat16" or "float16"."""

    def encode(self, text: str) -> list[int]:
        """The token ids of `text` (no special tokens added)."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids."""

    def dla(self, prompt: Prompts, target: int | str, *, vs: int | str | None = None) -> dict[str, Any]:
        """Direct logit attribution of the prompt's last position: `logit` (target less `vs`,
        before any final soft-cap) split into `embeddings`, `layers` (`mixer`, `heads`,
        `mixer_rest`, `mlp` per layer), `final_norm_bias` and `head_bias`, which sum to it."""

    def sites(self, prompt_len: int = 10, step: int = 1, batch: int = 1) -> list[dict[str, Any]]:
        """Every site in call order: `name`, symbolic `shape`, `step0` and `decode` shapes."""

    def trace(
        self,
        prompts: Prompts,
        *,
        save: Sequence[str] | None = None,
        zero: Sequence[str] | None = None,
        add: Mapping[str, ArrayLike] | None = None,
        set: Mapping[str, ArrayLike] | None = None,
        grad: str | None = None,
        save_grad: Sequence[str] | None = None,
    ) -> Run:
        """One forward call (step 0). `save`/`zero` take `PATTERN[INDEX]`; `add`/`set` map such a
        target to an array that broadcasts to the selected value. `grad` names a metric of the
        logits ("logit-diff: A, B", "logit:A", "prob:A", "logprob:A", each with an optional
        "@POS", or "loss"): its value comes back as `Run.metric` and its gradient at the
        `save_grad` patterns as `Run.grads` (a model loaded with `gradients=True`)."""

    def generate(
        self,
        prompts: Prompts,
        max_new_tokens: int,
        *,
        greedy: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        save: Sequence[str] | None = None,
        zero: Sequence[str] | None = None,
        add: Mapping[str, ArrayLike] | None = None,
        set: Mapping[str, ArrayLike] | None = None,
        on_step: Callable[[int], object] | None = None,
    ) -> Run:
        """Generate up to `max_new_tokens` tokens per prompt, with reads and writes at the steps
        they name (`@K`, `@A:B`, `@all`; default every step). `on_step(step)` is called before
        each step runs; an exception it raises stops the generation. Ctrl-C raises
        KeyboardInterrupt between steps."""
