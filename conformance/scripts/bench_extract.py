#!/usr/bin/env python3
"""Time `hookscope extract` against the same job written with transformers forward hooks, on the
same model, machine and run, and measure each process's peak RSS; print Markdown for
BENCHMARKS.md.

    python conformance/scripts/make_fixtures.py --bench-model bench-models/gpt2-small
    cargo build --release -p hookscope-cli
    python conformance/scripts/bench_extract.py --model bench-models/gpt2-small --threads 2

The job: `--prompts` prompts of 16-256 random token ids (uniform), the residual stream after
layers 0, 3, 6 and 9 saved for every real token, batches of 8 from windows of 128 prompts
sorted by length, files of 16,384 rows. The transformers version does the same: left-padded
batches with an attention mask and position ids, forward hooks copying the real tokens' rows
to numpy, `safetensors.numpy.save_file` per 16,384 rows; `transformers-stop` also ends each
forward pass in the last saved layer's hook (as nnsight's `tracer.stop()` and hookscope do). Both are timed as whole processes
(model load included) with the same thread count; peak RSS comes from `wait4`.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = [0, 3, 6, 9]
BATCH = 8
WINDOW = 16 * BATCH
ROWS_PER_FILE = 16_384


def write_prompts(path, count, vocab, seed=0):
    rng = random.Random(seed)
    tokens = 0
    with open(path, "w") as f:
        for _ in range(count):
            ids = [rng.randrange(vocab) for _ in range(rng.randint(16, 256))]
            tokens += len(ids)
            f.write(json.dumps({"ids": ids}) + "\n")
    return tokens


def run_measured(command, env):
    """Runs a command; returns (wall seconds, peak RSS in MB)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"{command[0]} failed with status {status}")
    return wall, usage.ru_maxrss / 1024


class StopForward(Exception):
    """Raised by the last hook to skip the rest of the forward pass (nnsight's `tracer.stop()`)."""


def baseline(model_dir, prompts_path, out_dir, threads, stop_early=False):
    """The same job with transformers forward hooks (run in its own process); with
    `stop_early`, the hook of the last saved layer ends the forward pass, as hookscope does."""
    import numpy as np
    import torch
    from safetensors.numpy import save_file
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    captured = {}

    def hook(layer):
        def save(_module, _inputs, output):
            captured[layer] = output[0] if isinstance(output, tuple) else output
            if stop_early and layer == LAYERS[-1]:
                raise StopForward

        return save

    for layer in LAYERS:
        model.transformer.h[layer].register_forward_hook(hook(layer))
    os.makedirs(out_dir, exist_ok=True)
    buffers = {layer: [] for layer in LAYERS}
    index = {"prompt_index": [], "position": [], "token_id": []}
    files = [0]

    def flush():
        if not index["prompt_index"]:
            return
        tensors = {f"layers.{l}.layer_output": np.concatenate(buffers[l]) for l in LAYERS}
        tensors.update({k: np.asarray(v, dtype=np.int64) for k, v in index.items()})
        save_file(tensors, os.path.join(out_dir, f"extract-{files[0]:06}.safetensors"))
        files[0] += 1
        for l in LAYERS:
            buffers[l].clear()
        for v in index.values():
            v.clear()

    prompts = [(line, json.loads(text)["ids"]) for line, text in enumerate(open(prompts_path))]
    with torch.no_grad():
        for start in range(0, len(prompts), WINDOW):
            window = sorted(prompts[start : start + WINDOW], key=lambda p: len(p[1]))
            for b in range(0, len(window), BATCH):
                batch = window[b : b + BATCH]
                rows = sum(len(ids) for _, ids in batch)
                if index["prompt_index"] and len(index["prompt_index"]) + rows > ROWS_PER_FILE:
                    flush()
                width = max(len(ids) for _, ids in batch)
                ids = torch.zeros(len(batch), width, dtype=torch.long)
                mask = torch.zeros(len(batch), width, dtype=torch.long)
                for row, (_, prompt) in enumerate(batch):
                    ids[row, width - len(prompt) :] = torch.tensor(prompt)
                    mask[row, width - len(prompt) :] = 1
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                try:
                    model(input_ids=ids, attention_mask=mask, position_ids=positions)
                except StopForward:
                    pass
                for row, (line, prompt) in enumerate(batch):
                    real = slice(width - len(prompt), width)
                    for l in LAYERS:
                        buffers[l].append(captured[l][row, real].numpy().copy())
                    index["prompt_index"] += [line] * len(prompt)
                    index["position"] += list(range(len(prompt)))
                    index["token_id"] += prompt
                if len(index["prompt_index"]) >= ROWS_PER_FILE:
                    flush()
    flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--binary", type=Path, default=ROOT / "target/release/hookscope")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--small", type=int, default=500, help="the smaller dataset for the RSS comparison")
    parser.add_argument("--work", type=Path, default=Path("/tmp/hookscope-bench-extract"))
    parser.add_argument("--variants", default="hookscope,transformers,transformers-stop",
                        help="which jobs to time (comma-separated)")
    parser.add_argument("--baseline", nargs=2, metavar=("PROMPTS", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--stop-early", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline:
        baseline(args.model, args.baseline[0], args.baseline[1], args.threads, args.stop_early)
        return
    vocab = json.load(open(args.model / "config.json"))["vocab_size"]
    args.work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
    results = {}
    for count in [args.small, args.prompts]:
        prompts = args.work / f"prompts-{count}.jsonl"
        tokens = write_prompts(prompts, count, vocab)
        for name in args.variants.split(","):
            out = args.work / f"{name}-{count}"
            subprocess.run(["rm", "-rf", str(out)], check=True)
            if name == "hookscope":
                command = [str(args.binary), "extract", str(args.model), "--prompts", str(prompts)]
                command += ["--out-dir", str(out), "--batch-size", str(BATCH)]
                command += ["--max-rows-per-file", str(ROWS_PER_FILE)]
                for layer in LAYERS:
                    command += ["--save", f"layers.{layer}.layer_output"]
            else:
                command = [sys.executable, __file__, "--model", str(args.model), "--threads", str(args.threads)]
                command += ["--baseline", str(prompts), str(out)]
                if name == "transformers-stop":
                    command.append("--stop-early")
            wall, rss = run_measured(command, env)
            results[(name, count)] = (tokens / wall, rss, wall)
            print(f"{name} {count} prompts: {tokens} tokens in {wall:.1f} s = {tokens / wall:.0f} tok/s, peak RSS {rss:.0f} MB", file=sys.stderr)
    print("| job | variant | tok/s | peak RSS |")
    print("| --- | --- | ---: | ---: |")
    for (name, count), (rate, rss, _) in results.items():
        print(f"| {count} prompts, 4 sites | {name} | {rate:.0f} | {rss:.0f} MB |")


if __name__ == "__main__":
    main()
