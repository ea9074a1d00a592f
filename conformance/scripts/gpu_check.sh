#!/usr/bin/env bash
# The GPU check, prepared for a session lent a GPU machine (no Rust toolchain there): build the
# binary here, carry it with wheels for transformers, run this script there in one call.
#
#   cargo build --release -p hookscope-cli --features vulkan
#   mkdir -p gpu-run && strip -o gpu-run/hookscope target/release/hookscope && xz -9e -T2 gpu-run/hookscope
#   (xz, not gzip: the binary with the Vulkan stack is 116 MB stripped, 36 MB gzipped, 23 MB in xz,
#   and the tree that travels, fixtures included, must stay under 64 MiB)
#   pip download --no-deps -d gpu-run/wheels transformers huggingface_hub ...   # if the machine lacks them
#   (gpu-run/ is git-ignored locally; carry it)  ->  bash conformance/scripts/gpu_check.sh vulkan
#
# It lists the devices, runs the conformance suite with transformers parity on the GPU device
# (every architecture, every fixture, 1e-4), makes a GPT-2-small-shaped random model and runs
# bench.py's GPU table (prompt call of 512 tokens and batch-1 decode against transformers on
# CUDA, f32 and bf16). Results land in $OUT.
set -u
export XDG_RUNTIME_DIR=/tmp RAYON_NUM_THREADS=8
DEV="${1:-vulkan}"
B=/tmp/hookscope
python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
  gpu-run/hookscope.xz "$B" && chmod +x "$B"
OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
log() { echo "== $* ($(date +%T))"; }
log environment
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
if ! python3 -c "import transformers" 2>/dev/null; then
  log installing transformers from the carried wheels
  python3 -m pip install -q --no-index --no-deps --find-links gpu-run/wheels transformers huggingface_hub \
    tokenizers safetensors regex pyyaml tqdm typer click shellingham typing_extensions annotated-doc filelock \
    fsspec httpx httpcore h11 anyio idna certifi sniffio packaging 2>&1 | tail -3
fi
python3 -c "import transformers; print('transformers', transformers.__version__)"
log devices
timeout 30 "$B" devices 2>&1 | tail -20
log "conformance and parity on $DEV"
# Minimal autotuning: this run checks values, and every fixture's shapes would otherwise be tuned.
CUBECL_AUTOTUNE_LEVEL=minimal timeout 240 "$B" conformance --fixtures conformance/fixtures --device "$DEV" > "$OUT/conformance-$DEV.txt" 2>&1
echo "exit status $?"
tail -30 "$OUT/conformance-$DEV.txt"
log "bench model"
timeout 90 python3 conformance/scripts/make_fixtures.py --bench-model /tmp/gpt2-small 2>&1 | tail -2
log "bench against transformers on cuda"
timeout 200 python3 conformance/scripts/bench.py --hookscope "$B" --gpu-models /tmp/gpt2-small --dtypes f32 bf16 \
  --device "$DEV" --torch-device cuda --iters 10 --warmup 3 --new-tokens 32 --generate-iters 3 --threads 8 \
  2>&1 | tee "$OUT/bench-gpt2.txt" | tail -20
log done
