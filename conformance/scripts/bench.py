#!/usr/bin/env python3
"""Time hookscope beside `transformers` on the same model, machine and run; print a Markdown
table of ratios for BENCHMARKS.md.

    python conformance/scripts/make_fixtures.py --bench-model bench-models/gpt2-small
    cargo build --release -p hookscope-cli
    python conformance/scripts/bench.py --model bench-models/gpt2-small --threads 2
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[2]


def time_transformers_forward(model_dir, prompt_len, iters, warmup):
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    times = []
    with torch.no_grad():
        for i in range(warmup + iters):
            start = time.perf_counter()
            model(ids)
            if i >= warmup:
                times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def time_hookscope_forward(binary, model_dir, prompt_len, iters, warmup, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    out = subprocess.run(
        [binary, "bench", str(model_dir), "--prompt-len", str(prompt_len), "--iters", str(iters), "--warmup", str(warmup)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(out.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--hookscope", default=str(ROOT / "target" / "release" / "hookscope"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[10, 128])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.threads} threads")
    print(f"torch {torch.__version__}\n")
    print("| prompt tokens | transformers forward (ms) | hookscope, no hooks (ms) | hookscope, every site saved (ms) | no hooks vs transformers | every site vs no hooks |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for prompt_len in args.prompt_lens:
        hf = time_transformers_forward(args.model, prompt_len, args.iters, args.warmup)
        hs = time_hookscope_forward(args.hookscope, args.model, prompt_len, args.iters, args.warmup, args.threads)
        plain = hs["no_hooks"]["median_ms"]
        saved = hs["save_every_site"]["median_ms"]
        print(
            f"| {prompt_len} | {hf:.1f} | {plain:.1f} | {saved:.1f} | {hf / plain:.2f}x speed | {saved / plain:.3f}x time |"
        )


if __name__ == "__main__":
    main()
