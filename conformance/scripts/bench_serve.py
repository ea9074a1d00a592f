#!/usr/bin/env python3
"""Load on `hookscope serve` (issue 37's check): CLIENTS concurrent clients x REQUESTS mixed
requests each (traces saving a site, greedy generations saving a site at every step, both as
JSON and as safetensors) against the embedded demo model. Every answer is compared with the same
request answered alone (before the load, one at a time), so a lost request or one answered with
another request's values fails the run. Prints throughput, p50/p99 latency and the server's
resident memory over the run (sampled from /proc), as JSON.

    python conformance/scripts/bench_serve.py --binary target/release/hookscope
    python conformance/scripts/bench_serve.py --binary ... --traces  # traces that can share calls
    python conformance/scripts/bench_serve.py --binary ... --traces --server-arg=--max-prompts=1

`--traces` sends only traces that can share a call (one save and ablation, prompts of one
length); `--max-prompts=1` on the server keeps every call to one request, the figure to compare
with. Values are compared within 1e-5 (a call shared with other requests may sum in another
order), ids exactly.

Needs numpy; the client is the Python package's `client.py`, loaded from the checkout by path
(it needs no native module).
"""

import argparse
import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

_CLIENT = Path(__file__).resolve().parents[2] / "crates/python/python/hookscope/client.py"
_spec = importlib.util.spec_from_file_location("hookscope_client", _CLIENT)
_client = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_client)
Client = _client.Client

PROMPTS = ["In the beginning God created", "And the earth was without form", "Let there be light",
           "The LORD is my shepherd", "Blessed are the meek", "And Jesus answered and said"]


def requests():
    """The mixed requests: (kind, prompt, keyword arguments)."""
    mixed = []
    for i, prompt in enumerate(PROMPTS):
        mixed.append(("trace", prompt, {"save": [f"layers.{i % 4}.layer_output[:, -1]"]}))
        mixed.append(("generate", prompt, {"max_new_tokens": 4, "greedy": True,
                                           "save": ["layers.1.mlp_output[:, -1]"]}))
        mixed.append(("trace", prompt, {"save": ["layers.0.self_attn.attention_probabilities"],
                                        "zero": ["layers.0.self_attn.attention_head_outputs[:, :, 1]"]}))
    return mixed


SAME_LENGTH = ["In the beginning", "And God said", "Let there be", "And the earth"]


def batchable_requests():
    """Traces that can share one call: the same save and ablation, prompts of one length."""
    options = {"save": ["layers.2.layer_output[:, -1]"],
               "zero": ["layers.0.self_attn.attention_head_outputs[:, :, 1]"]}
    return [("trace", prompt, options) for prompt in SAME_LENGTH]


def call(client, request):
    kind, prompt, kwargs = request
    if kind == "trace":
        return client.trace(prompt, **kwargs)
    kwargs = dict(kwargs)
    return client.generate(prompt, kwargs.pop("max_new_tokens"), **kwargs)


def same(a, b):
    return (sorted(a.saved) == sorted(b.saved)
            and all(np.allclose(a.saved[k], b.saved[k], rtol=0, atol=1e-5) for k in a.saved)
            and np.array_equal(a.output_ids, b.output_ids))


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--traces", action="store_true",
                        help="only traces that can share a call")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="an argument for `hookscope serve` (repeatable)")
    args = parser.parse_args()

    server = subprocess.Popen([args.binary, "serve", "--addr", "127.0.0.1:0", *args.server_arg],
                              stderr=subprocess.PIPE, text=True)
    url = "http://" + server.stderr.readline().split("http://")[1].split("/")[0]
    client = Client(url)
    mixed = batchable_requests() if args.traces else requests()
    alone = [call(client, r) for r in mixed]

    samples, done = [], threading.Event()

    def sample():
        while not done.is_set():
            samples.append(rss_kib(server.pid))
            time.sleep(0.2)

    latencies, failures, lock = [], [], threading.Lock()

    def run(index):
        mine = Client(url)
        for n in range(args.requests):
            which = (index * 7 + n) % len(mixed)
            started = time.perf_counter()
            try:
                answer = call(mine, mixed[which])
                ok = same(answer, alone[which])
            except Exception as error:  # a lost request is a failure, whatever the cause
                ok, answer = False, error
            with lock:
                latencies.append(time.perf_counter() - started)
                if not ok:
                    failures.append((index, n, repr(answer)[:200]))

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    done.set()
    sampler.join()
    server.terminate()
    server.wait(timeout=60)

    total = args.clients * args.requests
    report = {
        "clients": args.clients, "requests": total, "traces_only": args.traces,
        "server_args": args.server_arg, "failures": len(failures),
        "seconds": round(elapsed, 2), "requests_per_second": round(total / elapsed, 1),
        "p50_ms": round(1000 * float(np.percentile(latencies, 50)), 1),
        "p99_ms": round(1000 * float(np.percentile(latencies, 99)), 1),
        "rss_mib_first_last_max": [round(samples[0] / 1024, 1), round(samples[-1] / 1024, 1),
                                   round(max(samples) / 1024, 1)],
    }
    print(json.dumps(report, indent=1))
    for failure in failures[:5]:
        print("failure:", failure, file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
