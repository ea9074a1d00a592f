#!/usr/bin/env python3
"""Train hookscope's embedded default model: a small GPT-2 on the King James Bible.

The text is the King James Version from Debian's `bible-kjv-text` package (the translation of
1611 is in the public domain; Debian packages it under the GPL, version 2 or later), read through
the package's `bible` program. The vocabulary is GPT-2's own, so the model keeps the real GPT-2
tokenizer.

Training first sees only random token sequences repeated twice, until one head attends from each
repeated token to the token after its first occurrence (an induction head), then batches of
King James text, random repeats (which keep the head) and repeated passages.

    apt-get install bible-kjv                 # the text and the `bible` reader
    pip install torch transformers safetensors tokenizers
    python conformance/scripts/train_demo_model.py      # ~15 minutes on 2 cores

Deterministic for a given torch build (seeded, 2 threads). Writes the float16 checkpoint to
`crates/hookscope/embedded/demo` and what the tests expect of it, computed here by
`transformers` on the stored weights, to `conformance/fixtures/demo.json`: greedy continuations,
and the induction head's attention on seeded random repeats.
"""

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures  # noqa: E402  (float16 rounding)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates" / "hookscope" / "embedded" / "demo"
EXPECTED = ROOT / "conformance" / "fixtures" / "demo.json"
TOKENIZER = ROOT / "conformance" / "fixtures" / "gpt2-tiny" / "tokenizer.json"
EOS = 50256
CONTEXT = 128
HALF = CONTEXT // 2
# Random repeats draw from these ids (ordinary GPT-2 tokens, none special).
REPEAT_IDS = torch.arange(300, 4300)
LR = 1e-2
# Phase 1 ends once the best head's induction score reaches this (checked every 50 steps).
INDUCTION_READY = 0.6
MAX_REPEAT_STEPS = 1500
PROMPTS = ["In the beginning God created", "And the LORD spake unto Moses, saying", "Jesus wept"]
NEW_TOKENS = 24


def kjv_chapters():
    """The whole King James Bible, one string per chapter, verse numbers removed."""
    raw = subprocess.run(["bible", "gen1:1-rev22:21"], capture_output=True, text=True, check=True).stdout
    chapters, verses = [], []
    for line in raw.splitlines():
        if re.fullmatch(r"[1-3]? ?[A-Z][A-Za-z ]+ \d+", line.strip()):
            if verses:
                chapters.append(" ".join(verses))
            verses = []
            continue
        text = re.sub(r"^\s*\d+ ", "", line).strip()
        if text:
            verses.append(text)
    if verses:
        chapters.append(" ".join(verses))
    return chapters


def random_repeats(generator, rows):
    """`rows` sequences of HALF random tokens followed by the same HALF again (CONTEXT + 1 long,
    inputs and next-token targets)."""
    picks = REPEAT_IDS[torch.randint(0, REPEAT_IDS.numel(), (rows, HALF), generator=generator)]
    return torch.cat([picks, picks, picks[:, :1]], dim=1)


def scored_second_halves(generator, rows, fraction):
    """Which positions of repeated rows are scored: a random `fraction` of the second half (the
    only predictable part of a random repeat)."""
    scored = torch.zeros(rows, CONTEXT, dtype=torch.bool)
    scored[:, HALF:] = torch.rand(rows, HALF, generator=generator) < fraction
    return scored


def mixed_batch(tokens, generator, text_rows, repeat_rows, passage_rows):
    """King James windows (a random quarter of positions scored), random repeats, and King James
    passages of HALF tokens repeated (both halves scored), with inputs, targets and scored mask."""
    n = tokens.numel() - CONTEXT - 1
    starts = torch.randint(0, n, (text_rows + passage_rows,), generator=generator)
    text = torch.stack([tokens[s : s + CONTEXT + 1] for s in starts[:text_rows]])
    passages = torch.stack([tokens[s : s + HALF] for s in starts[text_rows:]])
    passages = torch.cat([passages, passages, passages[:, :1]], dim=1)
    x = torch.cat([text, random_repeats(generator, repeat_rows), passages])
    scored = torch.cat(
        [
            torch.rand(text_rows, CONTEXT, generator=generator) < 0.25,
            scored_second_halves(generator, repeat_rows, 0.5),
            torch.rand(passage_rows, CONTEXT, generator=generator) < 0.25,
        ]
    )
    return x[:, :-1], x[:, 1:], scored


def induction_scores(model, ids):
    """Per layer and head, the mean attention from each second-half token to the token after its
    first occurrence, on `ids` (rows of HALF tokens repeated)."""
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions
    queries = torch.arange(HALF, CONTEXT)
    keys = queries - HALF + 1
    return torch.stack([probs[:, :, queries, keys].mean(dim=(0, 2)) for probs in attentions])


def train(model, tokens, steps, batch_size):
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.01)
    generator = torch.Generator().manual_seed(0)
    probe = random_repeats(torch.Generator().manual_seed(1), 8)[:, :-1]
    start = time.time()
    model.train()

    def step(x, y, scored, lr):
        for group in optimizer.param_groups:
            group["lr"] = lr
        # The vocabulary-sized head dominates the cost: only the scored positions go through it.
        hidden = model.transformer(input_ids=x).last_hidden_state[scored]
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden), y[scored])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()

    def report(phase, k, loss):
        score = induction_scores(model, probe).max().item()
        print(f"{phase} {k:5d}  loss {loss:.3f}  induction {score:.2f}  {time.time() - start:.0f}s", flush=True)
        return score

    # Phase 1: random repeats only, at a constant rate, until a head attends from each repeated
    # token to its successor's first occurrence.
    for k in range(MAX_REPEAT_STEPS):
        x = random_repeats(generator, batch_size)
        loss = step(x[:, :-1], x[:, 1:], scored_second_halves(generator, batch_size, 0.5), LR)
        if k % 50 == 49 and report("repeats", k, loss) >= INDUCTION_READY:
            break
    # Phase 2: text, repeats and repeated passages, the rate decaying from LR / 3 to 0.
    quarter = batch_size // 4
    for k in range(steps):
        batch = mixed_batch(tokens, generator, batch_size - 2 * quarter, quarter, quarter)
        loss = step(*batch, LR / 3 * 0.5 * (1 + math.cos(math.pi * k / steps)))
        if k % 100 == 99 or k == steps - 1:
            report("mixed", k, loss)
    return model.eval()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500, help="steps of the mixed phase")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    ids = []
    for chapter in kjv_chapters():
        ids.extend(tokenizer.encode(chapter).ids)
        ids.append(EOS)
    tokens = torch.tensor(ids)
    print(f"{tokens.numel()} tokens of King James text", flush=True)
    config = GPT2Config(
        vocab_size=EOS + 1, n_positions=CONTEXT, n_embd=64, n_layer=args.layers, n_head=4, n_inner=256,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=EOS, eos_token_id=EOS,
    )
    config._attn_implementation = "eager"  # attention probabilities for the induction score
    model = train(GPT2LMHeadModel(config), tokens, args.steps, args.batch_size)

    # The checkpoint is stored in float16: round first, so what is expected is the stored model's.
    make_fixtures.round_to_half(model)
    generation = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
    continuations = []
    with torch.no_grad():
        for prompt in PROMPTS:
            prompt_ids = tokenizer.encode(prompt).ids
            out = model.generate(torch.tensor([prompt_ids]), generation_config=generation)[0].tolist()
            print(f"{prompt!r} -> {tokenizer.decode(out[len(prompt_ids):])!r}")
            continuations.append({"prompt": prompt, "output_ids": out})
    probe = random_repeats(torch.Generator().manual_seed(2), 4)[:, :-1]
    scores = induction_scores(model, probe)
    layer, head = divmod(scores.argmax().item(), scores.shape[1])
    print(f"induction head {layer}.{head}: {scores[layer, head].item():.3f}")
    EXPECTED.write_text(
        json.dumps(
            {
                "continuations": continuations,
                "induction": {
                    "input_ids": probe.tolist(),
                    "layer": layer,
                    "head": head,
                    "score": scores[layer, head].item(),
                },
            }
        )
        + "\n"
    )
    OUT.mkdir(parents=True, exist_ok=True)
    model.half().save_pretrained(OUT, safe_serialization=True)
    GenerationConfig(bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS, do_sample=False).save_pretrained(OUT)
    shutil.copy(TOKENIZER, OUT / "tokenizer.json")
    print(f"wrote {OUT} and {EXPECTED}")


if __name__ == "__main__":
    main()
