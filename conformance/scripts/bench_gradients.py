#!/usr/bin/env python3
"""The cost of a gradient pass (issue 36): hookscope's `trace(grad=..., save_grad=...)` against
transformers' forward + backward with the same sites' gradients retained, on one model and
prompt length, each in its own process (time: median of REPEATS after one warm-up; memory: the
process's peak RSS less its RSS after loading). Prints JSON.

    python conformance/scripts/make_fixtures.py --bench-model /tmp/bench-gpt2
    python conformance/scripts/bench_gradients.py --model /tmp/bench-gpt2 --tokens 128

Needs the Python package (`hookscope` importable, built from this checkout) and torch +
transformers. The metric is the mean next-token loss; the sites are every layer's output.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

REPEATS = 3


def cpu():
    """The CPU's model name, family/model and widest vector extension, from /proc/cpuinfo."""
    info = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.machine()
    flags = info.get("flags", "").split()
    vector = next((f for f in ("avx512f", "avx2") if f in flags), "no AVX2")
    return (f"{info.get('model name', platform.machine())} (family {info.get('cpu family')}, "
            f"model {info.get('model')}, {vector})")


def rss_mib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_hookscope(model_dir, ids, layers):
    import hookscope

    model = hookscope.Model(model_dir, gradients=True)
    loaded = rss_mib()
    sites = [f"layers.{i}.layer_output" for i in range(layers)]

    def once():
        return model.trace([ids], grad="loss", save_grad=sites)

    once()
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        run = once()
        times.append(time.perf_counter() - started)
    assert len(run.grads) == layers
    return {"seconds": statistics.median(times), "loss": run.metric,
            "peak_over_loaded_mib": peak_mib() - loaded}


def run_transformers(model_dir, ids, layers):
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count())
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    loaded = rss_mib()
    blocks = model.transformer.h if hasattr(model, "transformer") else model.model.layers
    kept = []

    def keep(_module, _args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden.retain_grad()
        kept.append(hidden)

    for block in blocks:
        block.register_forward_hook(keep)
    embeddings = model.get_input_embeddings()
    embeddings.register_forward_hook(lambda m, a, o: o.requires_grad_(True))
    tensor = torch.tensor([ids])

    def once():
        kept.clear()
        loss = model(input_ids=tensor, labels=tensor).loss
        loss.backward()
        return float(loss), [h.grad for h in kept]

    once()
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        loss, grads = once()
        times.append(time.perf_counter() - started)
    assert len(grads) == layers and all(g is not None for g in grads)
    return {"seconds": statistics.median(times), "loss": loss,
            "peak_over_loaded_mib": peak_mib() - loaded}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--which", choices=["hookscope", "transformers"])
    args = parser.parse_args()
    config = json.load(open(os.path.join(args.model, "config.json")))
    layers = config.get("n_layer") or config["num_hidden_layers"]
    vocab = config["vocab_size"]
    ids = [(i * 7919 + 13) % vocab for i in range(args.tokens)]
    if args.which:
        run = run_hookscope if args.which == "hookscope" else run_transformers
        print(json.dumps(run(args.model, ids, layers)))
        return
    results = {}
    for which in ("hookscope", "transformers"):
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--tokens",
                              str(args.tokens), "--which", which],
                             check=True, capture_output=True, text=True).stdout
        results[which] = json.loads(out.strip().splitlines()[-1])
    h, t = results["hookscope"], results["transformers"]
    print(json.dumps({
        "cpu": cpu(), "threads": os.cpu_count(),
        "tokens": args.tokens, "layers": layers, **results,
        "time_ratio_transformers_over_hookscope": round(t["seconds"] / h["seconds"], 3),
        "memory_ratio_hookscope_over_transformers":
            round(h["peak_over_loaded_mib"] / max(t["peak_over_loaded_mib"], 1e-9), 3),
    }, indent=1))


if __name__ == "__main__":
    main()
