"""`hookscope.Client`: a model served by `hookscope serve`, with the local `Model`'s methods.

    c = hookscope.Client("http://127.0.0.1:7878", token=None)
    g = c.generate("In the beginning", max_new_tokens=3, save=["layers.1.layer_output"])
    g.saved["layers.1.layer_output@0"].shape

A notebook switches between a local model and a served one by one line. Saved values travel as a
safetensors file (binary); nothing but data crosses the wire. Only the standard library and
numpy are needed.
"""

import json
import struct
import urllib.error
import urllib.request

import numpy as np

__all__ = ["Client", "RemoteRun", "ServerError"]

_DTYPES = {"F32": np.float32, "I64": np.int64, "I32": np.int32, "BOOL": np.bool_}


class ServerError(Exception):
    """A request the server refused or failed: `status` is the HTTP status, the message the
    server's."""

    def __init__(self, status, message):
        super().__init__(f"{status}: {message}")
        self.status = status


class RemoteRun:
    """What `Client.trace` and `Client.generate` return: the fields of the local `Run`
    (`saved`, `output_ids`, `attention_mask`, `text`, `new_text`, `steps`) and the server's
    `report`."""

    def __init__(self, saved, output_ids, attention_mask, text, new_text, steps, report):
        self.saved = saved
        self.output_ids = output_ids
        self.attention_mask = attention_mask
        self.text = text
        self.new_text = new_text
        self.steps = steps
        self.report = report

    def __repr__(self):
        return f"RemoteRun(steps={self.steps}, saved={len(self.saved)} values, text={self.text!r})"


def _read_safetensors(data):
    """The tensors and the metadata of a safetensors file's bytes."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    metadata = header.pop("__metadata__", {})
    start = 8 + length
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[start + begin : start + end], dtype=_DTYPES[info["dtype"]])
        tensors[name] = array.reshape(info["shape"]).copy()
    return tensors, metadata


def _writes(values):
    """A `{target: number or array}` dict as the API's write list."""
    writes = []
    for target, value in (values or {}).items():
        if np.isscalar(value):
            writes.append({"target": target, "value": float(value)})
        else:
            array = np.asarray(value, dtype=np.float32)
            writes.append({"target": target, "values": array.ravel().tolist(), "shape": list(array.shape)})
    return writes


def _token(token):
    """A token for the server: one-token text as is, an id as `#ID`."""
    return token if isinstance(token, str) else f"#{int(token)}"


class Client:
    """A model behind `hookscope serve` at `url`, with the local `Model`'s `trace`,
    `generate`, `sites` and `dla`, and the server's analyses (`lens`, `attention`, `features`,
    `patch`)."""

    def __init__(self, url="http://127.0.0.1:7878", token=None, timeout=300):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _request(self, method, path, body=None):
        headers = {"Content-Type": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                return answer.read()
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            try:
                message = json.loads(text)["error"]
            except (ValueError, KeyError, TypeError):
                message = text
            raise ServerError(error.code, message) from None

    def model(self):
        """The served model: architecture, sizes, attached dictionaries and the limits."""
        return json.loads(self._request("GET", "/v1/model"))

    def sites(self, prompt_len=10, step=1, batch=1):
        """Every site in call order, as the local `Model.sites` lists them."""
        query = f"/v1/sites?prompt_len={int(prompt_len)}&step={int(step)}&batch={int(batch)}"
        return json.loads(self._request("GET", query))["sites"]

    def trace(self, prompts, *, save=None, zero=None, add=None, set=None):
        """One forward call, as `Model.trace`."""
        body = self._body(prompts, save, zero, add, set)
        return self._run(body, generating=False)

    def generate(self, prompts, max_new_tokens, *, greedy=None, temperature=None, top_k=None,
                 top_p=None, seed=0, save=None, zero=None, add=None, set=None):
        """A generation, as `Model.generate`."""
        body = self._body(prompts, save, zero, add, set)
        body["max_new_tokens"] = int(max_new_tokens)
        if greedy is not None:
            body["greedy" if greedy else "sample"] = True
        for key, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
            if value is not None:
                body[key] = value
        if seed:
            body["seed"] = int(seed)
        return self._run(body, generating=True)

    def dla(self, prompt, target, *, vs=None):
        """Direct logit attribution of `prompt`'s last position, as `Model.dla` (tokens as ids
        or one-token strings)."""
        body = {"target": _token(target)}
        if vs is not None:
            body["vs"] = _token(vs)
        report = self._analysis("/v1/dla", prompt, body)
        report.pop("tokens")
        report["vs"] = report.pop("versus")
        return report

    def lens(self, prompt, top_k=1):
        """The logit lens, as `hookscope lens --json`: `{"tokens", "layers": [{"layer",
        "positions": [{"position", "top": [{"id", "token", "prob"}]}]}]}`."""
        return self._analysis("/v1/lens", prompt, {"top_k": int(top_k)})

    def attention(self, prompt, layers=None):
        """Attention patterns: `{"tokens", "layers": {layer: array [heads, queries, keys]}}`,
        every softmax attention layer unless `layers` names some."""
        body = {} if layers is None else {"layers": [int(layer) for layer in layers]}
        report = self._analysis("/v1/attention", prompt, body)
        patterns = {row["layer"]: np.asarray(row["heads"], dtype=np.float32)
                    for row in report["layers"]}
        return {"tokens": report["tokens"], "layers": patterns}

    def features(self, prompt, top_k=5):
        """The attached dictionaries' most active features per token, as `hookscope features
        --json`, with the prompt's `tokens`."""
        return self._analysis("/v1/features", prompt, {"top_k": int(top_k)})

    def patch(self, clean, corrupt, site, metric):
        """The activation-patching sweep, as `hookscope patch --json`: `{"metric", "clean",
        "corrupt", "positions", "sites": [{"site", "scores"}]}`."""
        body = {"clean": clean, "corrupt": corrupt, "site": site, "metric": metric}
        return json.loads(self._request("POST", "/v1/patch", body))

    def _analysis(self, path, prompt, fields):
        if isinstance(prompt, str):
            body = {"prompt": prompt}
        else:
            body = {"input_ids": [int(token) for token in prompt]}
        return json.loads(self._request("POST", path, {**body, **fields}))

    @staticmethod
    def _body(prompts, save, zero, add, set):
        if isinstance(prompts, str):
            prompts = [prompts]
        prompts = list(prompts)
        key = "input_ids" if prompts and not isinstance(prompts[0], str) else "prompts"
        if key == "input_ids":
            prompts = [[int(token) for token in row] for row in prompts]
        return {key: prompts, "save": list(save or []), "zero": list(zero or []),
                "add": _writes(add), "set": _writes(set), "format": "safetensors"}

    def _run(self, body, generating):
        tensors, metadata = _read_safetensors(self._request("POST", "/v1/run", body))
        report = json.loads(metadata["report"])
        output_ids = tensors.pop("output_ids")
        attention_mask = tensors.pop("attention_mask", None)
        rows = report["prompts"]
        new_text = [row.get("continuation", "") for row in rows] if generating else ["" for _ in rows]
        text = [row["prompt"] + new for row, new in zip(rows, new_text)]
        steps = report.get("steps", 1)
        return RemoteRun(tensors, output_ids, attention_mask, text, new_text, steps, report)
