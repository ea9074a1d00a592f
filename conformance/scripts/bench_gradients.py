#!/usr/bin/env python3
"""The cost of a gradient pass (issue 36): hookscope's `trace(grad=..., save_grad=...)` against
transformers' forward + backward with the same sites' gradients retained, on one model and
prompt length, each in its own process (time: median of REPEATS after one warm-up; memory: the
process's peak RSS less its RSS after loading; the loaded model's RSS beside it: transformers
maps the checkpoint, so its figure grows as pages are first read). Prints JSON.

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

    before = rss_mib()
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
            "peak_over_loaded_mib": peak_mib() - loaded, "loaded_mib": loaded - before}


def run_transformers(model_dir, ids, layers):
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count())
    before = rss_mib()
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
            "peak_over_loaded_mib": peak_mib() - loaded, "loaded_mib": loaded - before}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3,
                        help="processes per side, alternating which runs first")
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
    # Rounds alternate which runs first, so that drift in a shared machine's speed falls on
    # both; each side's figure is its median over the rounds, the ratio the median of the
    # rounds' ratios.
    rounds = {"hookscope": [], "transformers": []}
    for round_index in range(args.rounds):
        order = ("hookscope", "transformers")
        for which in order if round_index % 2 == 0 else order[::-1]:
            out = subprocess.run([sys.executable, __file__, "--model", args.model, "--tokens",
                                  str(args.tokens), "--which", which],
                                 check=True, capture_output=True, text=True).stdout
            rounds[which].append(json.loads(out.strip().splitlines()[-1]))

    def median_of(which, key):
        return statistics.median(run[key] for run in rounds[which])

    results = {which: {"seconds": median_of(which, "seconds"),
                       "peak_over_loaded_mib": median_of(which, "peak_over_loaded_mib"),
                       "loaded_mib": median_of(which, "loaded_mib"),
                       "loss": rounds[which][0]["loss"]} for which in rounds}
    h, t = results["hookscope"], results["transformers"]
    ratios = [tr["seconds"] / hr["seconds"]
              for hr, tr in zip(rounds["hookscope"], rounds["transformers"])]
    print(json.dumps({
        "cpu": cpu(), "threads": os.cpu_count(),
        "tokens": args.tokens, "layers": layers, "rounds": args.rounds, **results,
        "time_ratio_transformers_over_hookscope": round(statistics.median(ratios), 3),
        "time_ratios_per_round": [round(r, 3) for r in ratios],
        "memory_ratio_hookscope_over_transformers":
            round(h["peak_over_loaded_mib"] / max(t["peak_over_loaded_mib"], 1e-9), 3),
    }, indent=1))

if __name__ == "__main__":
    main()
