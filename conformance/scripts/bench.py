#!/usr/bin/env python3
"""Time hookscope beside `transformers` and nnterp on the same model, machine and run; print
Markdown tables of ratios for BENCHMARKS.md.

    python conformance/scripts/make_fixtures.py --bench-model bench-models/gpt2-small
    cargo build --release -p hookscope-cli
    pip install torch transformers "nnsight==0.7.0" "nnterp==1.3.*" "cloudpickle==3.0.0"
    python conformance/scripts/bench.py --model bench-models/gpt2-small --threads 2

Forward: one call on a prompt. Generation: greedy, `--new-tokens` tokens from a 10-token
prompt; decode milliseconds per token are (time(N tokens) - time(1 token)) / (N - 1).

Weights in each precision against transformers in the same dtype, and llama.cpp on GGUF
conversions (`pip install llama-cpp-python gguf` builds llama.cpp from its sdist, ~6 min on 2
cores; its sdist's `vendor/llama.cpp/convert_hf_to_gguf.py --outtype f32|bf16|f16` converts, with
`n_ctx` added to a GPT-2 config saved by transformers 5):

    python conformance/scripts/bench.py --precision-models bench-models/gpt2-small \
        --llama-cpp f32=gpt2-f32.gguf bf16=gpt2-bf16.gguf f16=gpt2-f16.gguf

Decode as the key/value cache grows (prompts of each `--contexts` length), on the same shapes
with 4096 positions:

    python conformance/scripts/make_fixtures.py --bench-long-model bench-models/gpt2-small-4k
    python conformance/scripts/bench.py --long-context-model bench-models/gpt2-small-4k
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


TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
# Where transformers runs (`--torch-device`): the CPU, or a GPU for the `--gpu-models` table.
TORCH_DEVICE = torch.device("cpu")


def synchronize():
    """Waits for the queued GPU work, so a timer stopped after it measures the work itself."""
    if TORCH_DEVICE.type == "cuda":
        torch.cuda.synchronize()


def load_transformers(model_dir, dtype=None):
    """The model in `dtype` (a `--dtype` name), or in transformers' default (`auto`)."""
    kwargs = {} if dtype is None else {"dtype": TORCH_DTYPES[dtype]}
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", **kwargs)
    return model.to(TORCH_DEVICE).eval()


def product_weights(model_dir, weights):
    """Weights that take part in a matrix product: all but an untied input embedding table (a
    lookup), which the loaded `weights` count."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    if config.get("tie_word_embeddings", True):
        return weights
    hidden = config.get("hidden_size", config.get("n_embd"))
    return weights - config["vocab_size"] * hidden


def bytes_read_per_token(model_dir, weight_bytes, dtype):
    """The weight bytes a decode step reads: all loaded weights but an untied input embedding
    table, of which a step reads one row (`dtype`: the weights' storage, `f32`/`bf16`/`f16`)."""
    size = 4 if dtype == "f32" else 2
    return product_weights(model_dir, weight_bytes / size) * size


def time_transformers_forward(model_dir, prompt_len, iters, warmup, dtype=None, batch=1):
    model = load_transformers(model_dir, dtype)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(0))
    ids = ids.to(TORCH_DEVICE)
    times = []
    with torch.no_grad():
        for i in range(warmup + iters):
            synchronize()
            start = time.perf_counter()
            model(ids)
            synchronize()
            if i >= warmup:
                times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def time_hookscope(binary, model_dir, prompt_len, iters, warmup, threads, new_tokens=None, dtype=None,
                   device=None, unhooked_only=False, matmul_precision=None, batch=1):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    command = [binary, "bench", str(model_dir), "--prompt-len", str(prompt_len), "--iters", str(iters)]
    command += ["--batch", str(batch)]
    command += ["--warmup", str(warmup)]
    if device is not None:
        command += ["--device", device]
    if dtype is not None:
        command += ["--dtype", dtype]
    if matmul_precision is not None:
        command += ["--matmul-precision", matmul_precision]
    if new_tokens is not None:
        command += ["--new-tokens", str(new_tokens)]
    if unhooked_only:
        command += ["--unhooked-only"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout)


def time_llama_cpp(gguf, prompt_len, new_tokens, threads, iters=3, logits_all=False):
    """llama.cpp (llama-cpp-python) on a GGUF conversion: a prompt evaluation of `prompt_len`
    tokens (logits for the last position only, llama.cpp's default, or for every position with
    `logits_all`, as hookscope's and transformers' prompt calls compute them) and the ms/token of
    evaluating `new_tokens` single tokens after a 10-token prompt (the forward passes of a greedy
    decode)."""
    from llama_cpp import Llama

    llm = Llama(str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=max(prompt_len, 10 + new_tokens) + 8,
                n_batch=max(prompt_len, 16), logits_all=logits_all, verbose=False)
    ids = torch.randint(0, llm.n_vocab(), (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()

    def prompt():
        llm.reset()
        llm.eval(ids)

    def decode():
        llm.reset()
        llm.eval(ids[:10])
        start = time.perf_counter()
        for token in ids[10:10 + new_tokens] if prompt_len >= 10 + new_tokens else [ids[0]] * new_tokens:
            llm.eval([token])
        return (time.perf_counter() - start) * 1e3 / new_tokens

    prompt_ms = median_ms(prompt, iters, 1)
    decode()
    return prompt_ms, statistics.median(decode() for _ in range(iters))


def median_ms(run, iters, warmup):
    times = []
    for i in range(warmup + iters):
        start = time.perf_counter()
        run()
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def time_transformers_generate(model_dir, prompt_len, new_tokens, iters, dtype=None):
    model = load_transformers(model_dir, dtype)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    ids = ids.to(TORCH_DEVICE)

    def run(n):
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        synchronize()

    return {n: median_ms(lambda: run(n), iters, 1) for n in (1, new_tokens)}


def time_nnterp_generate(model_dir, prompt_len, new_tokens, iters):
    """nnterp with no saves and with `layers[L].layer_output` saved at every step."""
    from nnterp import StandardizedTransformer

    model = StandardizedTransformer(str(model_dir), device_map="cpu", attn_implementation="eager")
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    middle = model.num_layers // 2
    results = {}
    for variant in ("no_hooks", "save_one_site"):
        def run(n, variant=variant):
            saved = []
            with model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0) as tracer:
                if variant == "save_one_site":
                    for _ in tracer.iter[:n]:
                        saved.append(model.layers[middle].output.save())
            return saved

        results[variant] = {n: median_ms(lambda n=n: run(n), iters, 1) for n in (1, new_tokens)}
    return results


def decode_ms(times, new_tokens):
    return (times[new_tokens] - times[1]) / (new_tokens - 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a GPT-2-shaped model: forward and generation tables")
    parser.add_argument("--hookscope", default=str(ROOT / "target" / "release" / "hookscope"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[10, 128])
    parser.add_argument("--batches", type=int, nargs="+", default=[1],
                        help="prompts per call in the --model forward table")
    parser.add_argument("--forward-only", action="store_true",
                        help="time the --model forward table only (no generation)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--generate-iters", type=int, default=3)
    parser.add_argument("--skip-nnterp", action="store_true")
    parser.add_argument("--precision-models", type=Path, nargs="+", default=[],
                        help="time prompt calls and decode with weights in f32, bf16 and f16 on these models")
    parser.add_argument("--dtypes", nargs="+", default=["f32", "bf16", "f16"], choices=sorted(TORCH_DTYPES))
    parser.add_argument("--llama-cpp", nargs="+", default=[], metavar="DTYPE=FILE.gguf",
                        help="GGUF conversions of the (one) --precision-models model, timed with llama-cpp-python")
    parser.add_argument("--long-context-model", type=Path,
                        help="a GPT-2-shaped model with room for --contexts (make_fixtures.py --bench-long-model)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[16, 1024, 2048])
    parser.add_argument("--mamba-model", type=Path, help="also time Mamba prompt calls of growing length")
    parser.add_argument("--mamba2-model", type=Path, help="also time Mamba-2 prompt calls and decode")
    parser.add_argument("--qwen3-next-model", type=Path, help="also time Qwen3-Next prompt calls and decode")
    parser.add_argument("--large-vocab-model", type=Path,
                        help="a large-vocabulary bf16 model (Gemma-2-2B-shaped): prompt, decode, load, memory, head")
    parser.add_argument("--gpu-models", type=Path, nargs="+", default=[],
                        help="time these models on a GPU: hookscope on --device, transformers on --torch-device")
    parser.add_argument("--device", default="vulkan", help="hookscope's --device for --gpu-models")
    parser.add_argument("--torch-device", default="cuda", help="transformers' device for --gpu-models")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    print(f"machine: {describe_cpu()}, {os.cpu_count()} cores, {args.threads} threads")
    cap = os.environ.get("HOOKSCOPE_CPU_KERNELS")
    print(f"hookscope kernels capped at {cap}" if cap else "hookscope kernels: the best this CPU has")
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}\n")
    if args.model:
        print_gpt2_tables(args)
    for model_dir in args.precision_models:
        print_precision_table(args, model_dir)
    if args.long_context_model:
        print_long_context_table(args, args.long_context_model)
    if args.mamba_model:
        print_recurrent_scaling(args, args.mamba_model, "Mamba", (16, 64, 256, 1024))
    if args.mamba2_model:
        print_recurrent_scaling(args, args.mamba2_model, "Mamba-2", (16, 64, 256, 1024))
        print_recurrent_decode(args, args.mamba2_model, "Mamba-2")
    if args.qwen3_next_model:
        print_recurrent_scaling(args, args.qwen3_next_model, "Qwen3-Next", (64, 256, 1024))
        print_recurrent_decode(args, args.qwen3_next_model, "Qwen3-Next")
    if args.large_vocab_model:
        print_large_vocab_table(args, args.large_vocab_model)
    if args.gpu_models:
        global TORCH_DEVICE
        TORCH_DEVICE = torch.device(args.torch_device)
        print(f"GPU: {torch.cuda.get_device_name(TORCH_DEVICE) if TORCH_DEVICE.type == 'cuda' else TORCH_DEVICE}")
        for model_dir in args.gpu_models:
            print_gpu_table(args, model_dir)


def print_gpt2_tables(args):
    print(f"{args.model.name}: prompt calls (f32)")
    print("| batch x prompt tokens | transformers forward (ms) | hookscope, no hooks (ms) | hookscope, every site saved (ms) | no hooks vs transformers | every site vs no hooks | f32 peak (GFLOPS) | transformers / hookscope, % of peak |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch in args.batches:
        for prompt_len in args.prompt_lens:
            hf = time_transformers_forward(args.model, prompt_len, args.iters, args.warmup, "f32", batch)
            hs = time_hookscope(args.hookscope, args.model, prompt_len, args.iters, args.warmup, args.threads,
                                dtype="f32", batch=batch)
            plain = hs["no_hooks"]["median_ms"]
            saved = hs["save_every_site"]["median_ms"]
            # Multiply-adds of the matrix products: every weight once per token (the head
            # included, the position table's few rows counted too); attention's own products
            # left out.
            flops = 2 * batch * prompt_len * product_weights(args.model, hs["weight_bytes"] / 4)
            peak = hs["f32_peak_gflops"]
            share = [100 * flops / (ms * 1e6) / peak for ms in (hf, plain)]
            print(
                f"| {batch} x {prompt_len} | {hf:.1f} | {plain:.1f} | {saved:.1f} | {hf / plain:.2f}x speed "
                f"| {saved / plain:.3f}x time | {peak:.0f} | {share[0]:.0f}% / {share[1]:.0f}% |"
            )
    ggufs = dict(item.split("=", 1) for item in args.llama_cpp)
    if "f32" in ggufs:
        print(f"\n{args.model.name}: prompt calls against llama.cpp f32 (batch 1)")
        print("| prompt tokens | llama.cpp, last position's logits (ms) | llama.cpp, every position's logits (ms) "
              "| hookscope, every position's logits (ms) | hookscope vs llama.cpp, like for like |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        for prompt_len in args.prompt_lens:
            last, _ = time_llama_cpp(ggufs["f32"], prompt_len, 2, args.threads, args.iters)
            every, _ = time_llama_cpp(ggufs["f32"], prompt_len, 2, args.threads, args.iters, logits_all=True)
            hs = time_hookscope(args.hookscope, args.model, prompt_len, args.iters, args.warmup, args.threads,
                                dtype="f32", unhooked_only=True)["no_hooks"]["median_ms"]
            print(f"| {prompt_len} | {last:.1f} | {every:.1f} | {hs:.1f} | {every / hs:.2f}x |")
    if args.forward_only:
        return

    n = args.new_tokens
    print(f"\nGreedy generation, 10-token prompt, {n} new tokens: decode ms/token")
    hf = decode_ms(time_transformers_generate(args.model, 10, n, args.generate_iters), n)
    runs = {}
    reports = []
    for tokens in (1, n):
        report = time_hookscope(args.hookscope, args.model, 10, args.generate_iters, 1, args.threads, tokens)
        reports.append(report)
        for variant in ("no_hooks", "save_one_site", "save_every_site"):
            runs.setdefault(variant, {})[tokens] = report[variant]["median_ms"]
    # Bandwidth is probed by each hookscope run; other tenants of the machine lower single probes.
    for probe in ("copy_gb_per_s", "read_gb_per_s"):
        report[probe] = max(r[probe] for r in reports)
    roofline = report["weight_bytes"] / (report["copy_gb_per_s"] * 1e9) * 1e3
    read_bound = report["weight_bytes"] / (report["read_gb_per_s"] * 1e9) * 1e3
    print(f"weights {report['weight_bytes'] / 1e6:.0f} MB, copy bandwidth {report['copy_gb_per_s']:.1f} GB/s, "
          f"roofline {roofline:.1f} ms/token; read bandwidth {report['read_gb_per_s']:.1f} GB/s, "
          f"weights read once {read_bound:.1f} ms/token ({hf / read_bound:.2f}x transformers)\n")
    print("| run | decode ms/token | tokens/s vs transformers | % of roofline | vs its own unhooked run |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(f"| transformers generate | {hf:.1f} | 1.00x | {100 * roofline / hf:.0f}% | |")
    if not args.skip_nnterp:
        nn = time_nnterp_generate(args.model, 10, n, args.generate_iters)
        nn_plain = decode_ms(nn["no_hooks"], n)
        for variant, label in (("no_hooks", "nnterp, no saves"), ("save_one_site", "nnterp, one site saved per step")):
            ms = decode_ms(nn[variant], n)
            print(f"| {label} | {ms:.1f} | {hf / ms:.2f}x | {100 * roofline / ms:.0f}% | {ms / nn_plain:.3f}x |")
    plain = decode_ms(runs["no_hooks"], n)
    for variant, label in (
        ("no_hooks", "hookscope, no hooks"),
        ("save_one_site", "hookscope, one site saved per step"),
        ("save_every_site", "hookscope, every site saved per step"),
    ):
        ms = decode_ms(runs[variant], n)
        print(f"| {label} | {ms:.1f} | {hf / ms:.2f}x | {100 * roofline / ms:.0f}% | {ms / plain:.3f}x |")


VECTOR_FEATURES = ["avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16",
                   "asimd", "fphp", "asimdhp", "sve"]


def describe_cpu():
    """The CPU's model and the vector features the kernels care about, from /proc/cpuinfo."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model in ("", platform.machine()):
                    model = value.strip()
                if key.strip() in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    features = [feature for feature in VECTOR_FEATURES if feature in flags]
    return f"{model} ({platform.machine()}; {' '.join(features) or 'no vector features read'})"


def print_precision_table(args, model_dir):
    """Prompt calls and decode with the weights stored in each precision, against transformers
    loaded in the same dtype (which also computes in it: AMX/AVX-512 BF16 kernels for bf16)."""
    prompt_len, n = 128, args.new_tokens
    ggufs = dict(item.split("=", 1) for item in args.llama_cpp)
    probe = time_hookscope(args.hookscope, model_dir, 10, 1, 0, args.threads, unhooked_only=True)
    print(f"\nCPU: {probe.get('cpu', '?')}, f32 peak {probe['f32_peak_gflops']:.0f} GFLOPS")
    print(f"\n{model_dir.name}: weights in each precision; prompt call of {prompt_len} tokens, "
          f"greedy decode from a 10-token prompt ({n} new tokens)")
    print("| weights | MB | transformers prompt (ms) | hookscope prompt (ms) | prompt vs transformers "
          "| transformers decode (ms/token) | hookscope decode (ms/token) | decode vs transformers "
          "| read bandwidth (GB/s) | hookscope % of weights-read-once bound |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    # bf16 weights are also timed with bf16 products (--matmul-precision bf16).
    variants = [(dtype, None) for dtype in args.dtypes]
    if "bf16" in args.dtypes:
        variants.insert(args.dtypes.index("bf16") + 1, ("bf16", "bf16"))
    for dtype, matmul in variants:
        hf_prompt = time_transformers_forward(model_dir, prompt_len, 3, 1, dtype)
        hf_decode = decode_ms(time_transformers_generate(model_dir, 10, n, args.generate_iters, dtype), n)
        hs_prompt = time_hookscope(args.hookscope, model_dir, prompt_len, 3, 1, args.threads, dtype=dtype,
                                   matmul_precision=matmul)
        runs = [time_hookscope(args.hookscope, model_dir, 10, args.generate_iters, 1, args.threads, t, dtype,
                               matmul_precision=matmul)
                for t in (1, n)]
        hs_decode = decode_ms({1: runs[0]["no_hooks"]["median_ms"], n: runs[1]["no_hooks"]["median_ms"]}, n)
        read = max(r["read_gb_per_s"] for r in runs + [hs_prompt])
        weights = runs[1]["weight_bytes"]
        bound = bytes_read_per_token(model_dir, weights, dtype) / (read * 1e9) * 1e3
        plain = hs_prompt["no_hooks"]["median_ms"]
        label = dtype if matmul is None else f"{dtype}, {matmul} products"
        label += f" ({hs_prompt.get('product_kernels', '?')} kernels)"
        print(f"| {label} | {weights / 1e6:.0f} | {hf_prompt:.0f} | {plain:.0f} | {hf_prompt / plain:.2f}x "
              f"| {hf_decode:.1f} | {hs_decode:.1f} | {hf_decode / hs_decode:.2f}x | {read:.1f} "
              f"| {100 * bound / hs_decode:.0f}% |")
        if dtype in ggufs and matmul is None:
            cpp_prompt, cpp_decode = time_llama_cpp(ggufs[dtype], prompt_len, n, args.threads)
            print(f"| {dtype}, llama.cpp in place of transformers | | {cpp_prompt:.0f} | {plain:.0f} "
                  f"| {cpp_prompt / plain:.2f}x | {cpp_decode:.1f} | {hs_decode:.1f} | {cpp_decode / hs_decode:.2f}x | | |")


def print_long_context_table(args, model_dir):
    """Greedy decode after prompts of growing length: what a step costs as the key/value cache
    grows, against transformers (eager attention, its dynamic cache) in the same run."""
    n = args.new_tokens
    print(f"\n{model_dir.name}: greedy decode after a prompt of each length, {n} new tokens, ms/token")
    print("| context | transformers | hookscope | hookscope vs transformers | hookscope vs its shortest context |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    shortest = None
    for context in args.contexts:
        hf = decode_ms(time_transformers_generate(model_dir, context, n, args.generate_iters), n)
        runs = [time_hookscope(args.hookscope, model_dir, context, args.generate_iters, 1, args.threads, t,
                               unhooked_only=True) for t in (1, n)]
        hs = decode_ms({1: runs[0]["no_hooks"]["median_ms"], n: runs[1]["no_hooks"]["median_ms"]}, n)
        shortest = shortest or hs
        print(f"| {context} | {hf:.1f} | {hs:.1f} | {hf / hs:.2f}x | {hs / shortest:.2f}x |")


def print_recurrent_scaling(args, model_dir, label, lengths):
    """Prompt calls of growing length against transformers' pure-torch kernels."""
    print(f"\n{label} prompt call (transformers' pure-torch kernels), ms")
    print("| prompt tokens | transformers | hookscope, no hooks | hookscope, every site saved | speed vs transformers | hookscope ms per token |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    for prompt_len in lengths:
        ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0))

        def run():
            with torch.no_grad():
                model(ids, use_cache=False)

        hf = median_ms(run, 3, 1)
        hs = time_hookscope(args.hookscope, model_dir, prompt_len, 3, 1, args.threads)
        plain, saved = hs["no_hooks"]["median_ms"], hs["save_every_site"]["median_ms"]
        print(f"| {prompt_len} | {hf:.0f} | {plain:.0f} | {saved:.0f} | {hf / plain:.2f}x | {plain / prompt_len:.2f} |")


def print_recurrent_decode(args, model_dir, label):
    """Greedy decode from a 10-token prompt: the one-token update of both implementations."""
    n = args.new_tokens
    hf = decode_ms(time_transformers_generate(model_dir, 10, n, args.generate_iters), n)
    runs = [time_hookscope(args.hookscope, model_dir, 10, args.generate_iters, 1, args.threads, t) for t in (1, n)]
    print(f"\n{label} greedy decode, 10-token prompt, {n} new tokens")
    print("| run | decode ms/token | tokens/s vs transformers |")
    print("| --- | ---: | ---: |")
    print(f"| transformers generate | {hf:.1f} | 1.00x |")
    for variant, name in (("no_hooks", "hookscope, no hooks"), ("save_every_site", "hookscope, every site saved")):
        ms = decode_ms({1: runs[0][variant]["median_ms"], n: runs[1][variant]["median_ms"]}, n)
        print(f"| {name} | {ms:.1f} | {hf / ms:.2f}x |")


def peak_rss_mb(command, env=None):
    """Runs `command` to its end; its output and its peak resident memory in MB."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    assert status == 0, f"{command[0]} exited with {status}"
    return out, usage.ru_maxrss / 1024


TRANSFORMERS_LOAD = """
import json, resource, sys, time
import torch
from transformers import AutoModelForCausalLM
torch.set_num_threads({threads})
start = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained({model!r}, dtype=torch.bfloat16, attn_implementation="eager").eval()
load = time.perf_counter() - start
with torch.no_grad():
    model(torch.zeros(1, 128, dtype=torch.long))
print(json.dumps({{"load_seconds": load}}))
"""


def time_transformers_head(model_dir, tokens, iters):
    """transformers' bf16 head alone (final norm, unembedding, soft-cap) on `tokens` positions."""
    model = load_transformers(model_dir, "bf16")
    hidden = torch.randn(1, tokens, model.config.hidden_size, dtype=torch.bfloat16)
    cap = getattr(model.config, "final_logit_softcapping", None)

    def run():
        with torch.no_grad():
            logits = model.lm_head(model.model.norm(hidden))
            if cap is not None:
                torch.tanh(logits / cap) * cap

    return median_ms(run, iters, 1)


def one_layer_copy(model_dir):
    """A folder beside `model_dir` whose config keeps one layer (the weights are the same files;
    the other layers' go unused): what a call costs without its layers but one."""
    copy = model_dir.parent / f"{model_dir.name}-1layer"
    copy.mkdir(exist_ok=True)
    config = json.loads((model_dir / "config.json").read_text())
    layers = config["num_hidden_layers"]
    config["num_hidden_layers"] = 1
    config.pop("layer_types", None)
    (copy / "config.json").write_text(json.dumps(config))
    for item in model_dir.iterdir():
        if item.name != "config.json" and not (copy / item.name).exists():
            (copy / item.name).symlink_to(item.resolve())
    return copy, layers


def print_large_vocab_table(args, model_dir):
    """A large-vocabulary model in bf16 (Gemma-2-2B's shapes: 256000 tokens): prompt calls and
    decode against transformers bf16, load time and peak memory, and what the head costs."""
    prompt_len, n = 128, args.new_tokens
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    print(f"\n{model_dir.name}: bf16, prompt call of {prompt_len} tokens, greedy decode from a 10-token prompt "
          f"({n} new tokens)")
    hf_prompt = time_transformers_forward(model_dir, prompt_len, 3, 1, "bf16")
    hf_decode = decode_ms(time_transformers_generate(model_dir, 10, n, args.generate_iters, "bf16"), n)
    hs_prompt = time_hookscope(args.hookscope, model_dir, prompt_len, 3, 1, args.threads, dtype="bf16",
                               unhooked_only=True)
    runs = [time_hookscope(args.hookscope, model_dir, 10, args.generate_iters, 1, args.threads, t, "bf16",
                           unhooked_only=True) for t in (1, n)]
    hs_decode = decode_ms({1: runs[0]["no_hooks"]["median_ms"], n: runs[1]["no_hooks"]["median_ms"]}, n)
    plain = hs_prompt["no_hooks"]["median_ms"]
    print("| | transformers bf16 | hookscope bf16 | hookscope vs transformers |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| prompt call (ms) | {hf_prompt:.0f} | {plain:.0f} | {hf_prompt / plain:.2f}x |")
    print(f"| decode (ms/token) | {hf_decode:.0f} | {hs_decode:.0f} | {hf_decode / hs_decode:.2f}x |")
    hf_out, hf_rss = peak_rss_mb(["python3", "-c", TRANSFORMERS_LOAD.format(threads=args.threads, model=str(model_dir))])
    hf_load = json.loads(hf_out)["load_seconds"]
    command = [args.hookscope, "bench", str(model_dir), "--prompt-len", str(prompt_len), "--iters", "1",
               "--warmup", "0", "--dtype", "bf16", "--unhooked-only"]
    hs_out, hs_rss = peak_rss_mb(command, env)
    hs_load = json.loads(hs_out)["load_seconds"]
    print(f"| load (s) | {hf_load:.1f} | {hs_load:.1f} | {hf_load / hs_load:.2f}x |")
    print(f"| peak memory, load + one {prompt_len}-token call (MB) | {hf_rss:.0f} | {hs_rss:.0f} | |")
    # The head alone: transformers' directly; hookscope's as a one-layer model's call less one
    # layer's share of the whole model's.
    single, layers = one_layer_copy(model_dir)
    for tokens, whole in ((prompt_len, plain), (1, None)):
        hf_head = time_transformers_head(model_dir, tokens, 5)
        one = time_hookscope(args.hookscope, single, tokens, 3, 1, args.threads, dtype="bf16",
                             unhooked_only=True)["no_hooks"]["median_ms"]
        if whole is None:
            whole = time_hookscope(args.hookscope, model_dir, tokens, 3, 1, args.threads, dtype="bf16",
                                   unhooked_only=True)["no_hooks"]["median_ms"]
        hs_head = one - (whole - one) / (layers - 1)
        print(f"| head alone, {tokens} position(s) (ms; hookscope's share of its whole call) | {hf_head:.0f} "
              f"| {hs_head:.0f} ({100 * hs_head / whole:.0f}%) | {hf_head / hs_head:.2f}x |")


def print_gpu_table(args, model_dir):
    """On a GPU, per precision: a prompt call of 512 tokens and greedy decode at batch 1 against
    transformers (eager attention, the same dtype), and the cost of saving every site per step."""
    prompt_len, n = 512, args.new_tokens
    print(f"\n{model_dir.name} on the GPU: hookscope --device {args.device}, transformers on "
          f"{args.torch_device}; prompt call of {prompt_len} tokens, greedy decode from a 10-token "
          f"prompt ({n} new tokens)")
    print("| weights | transformers prompt (ms) | hookscope prompt (ms) | prompt vs transformers "
          "| transformers decode (ms/token) | hookscope decode (ms/token) | decode vs transformers "
          "| every site saved per step vs unhooked |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for dtype in args.dtypes:
        hf_prompt = time_transformers_forward(model_dir, prompt_len, args.iters, args.warmup, dtype)
        hf_decode = decode_ms(time_transformers_generate(model_dir, 10, n, args.generate_iters, dtype), n)
        hs_prompt = time_hookscope(args.hookscope, model_dir, prompt_len, args.iters, args.warmup, args.threads,
                                   dtype=dtype, device=args.device)
        runs = [time_hookscope(args.hookscope, model_dir, 10, args.generate_iters, 1, args.threads, t, dtype,
                               args.device) for t in (1, n)]
        plain = hs_prompt["no_hooks"]["median_ms"]
        hs_decode, hs_saved = (
            decode_ms({1: runs[0][variant]["median_ms"], n: runs[1][variant]["median_ms"]}, n)
            for variant in ("no_hooks", "save_every_site"))
        print(f"| {dtype} | {hf_prompt:.1f} | {plain:.1f} | {hf_prompt / plain:.2f}x | {hf_decode:.2f} "
              f"| {hs_decode:.2f} | {hf_decode / hs_decode:.2f}x | {hs_saved / hs_decode:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
