"""Train the demo model embedded as hookscope's default: a small Llama on the King James Bible.

The text is the King James Version (1611, public domain) as Debian's `bible-kjv-text` package
ships it (`apt-get install bible-kjv`; the package's own files are GPL-2+, the text has no
copyright), read with its `bible` program. The model keeps GPT-2's tokenizer and its whole
vocabulary: a Llama with 4 layers, 64 wide, 4 query and 2 key/value heads, rotary positions, 128
positions and tied embeddings, stored in float16 (6.9 MB).

Training is built to make the model show what interpretability tools look for:
1. Repeated random tokens only (`<|endoftext|>`, then distinct random ids repeated with a random
   period per window, so that "attend k back" cannot stand in for matching content), the loss
   over just the ids drawn: first from 16 ids, then 64, 256 and 1,000, moving on once some head
   puts 0.6 of its attention on the token after the previous occurrence. With 1,000 ids from the
   start no induction head formed in 3,000 steps; with 16 one forms in ~300 steps and carries
   over to larger sets.
2. Text from a random verse on (60 % of the windows), repeated random tokens and repeated
   passages, the loss over the 4,000 most frequent ids (98 % of the text; five times cheaper
   than the whole vocabulary), plus LayerSkip's early-exit loss (Elhoushi et al., 2024) so that
   the logit lens sharpens layer by layer.
3. A few steps over the whole vocabulary, so that ids the text never uses get low logits too.

Then it writes `conformance/tests/demo_model.json`: what `transformers` computes on the stored
weights, which `conformance/tests/checks/demo_model.rs` compares hookscope with. Seeded; about 24
minutes on 2 cores.

    python conformance/scripts/train_demo_model.py --out crates/hookscope/embedded/demo
"""

import argparse
import json
import math
import shutil
import subprocess
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "conformance" / "fixtures" / "gpt2-tiny" / "tokenizer.json"
EOS = 50256
CONTEXT = 128
CONTINUATION_PROMPTS = [
    "The Eiffel Tower is in the city of",
    "In the beginning God created",
    "And the LORD said unto Moses,",
]
LENS_PROMPT = "And God said, Let there be light: and there was light. And God saw the light, that it was good."
REFERENCES = ROOT / "conformance" / "tests" / "demo_model.json"


def kjv_verses(path):
    """The verses of the King James Bible, one string each, in canonical order."""
    if path:
        lines = Path(path).read_text().splitlines()
    else:
        listing = subprocess.run(
            ["bible", "-l", "100000", "Gen1:1-Rev22:21"], check=True, capture_output=True, text=True
        )
        lines = listing.stdout.splitlines()
    verses = []
    for line in lines:
        number, _, text = line.strip().partition(" ")
        if number.isdigit() and text:
            verses.append(text)
    return verses


def tokenize(verses):
    """The whole text as one id sequence (verses separated by newlines) and each verse's start."""
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    ids, starts = [], []
    for encoding in tokenizer.encode_batch([verse + "\n" for verse in verses]):
        starts.append(len(ids))
        ids.extend(encoding.ids)
    return torch.tensor(ids), torch.tensor(starts)


def build_model(args):
    """The untrained model."""
    config = LlamaConfig(
        vocab_size=EOS + 1, hidden_size=args.width, intermediate_size=4 * args.width,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=CONTEXT, rms_norm_eps=1e-5, rope_theta=10000.0,
        bos_token_id=EOS, eos_token_id=EOS, tie_word_embeddings=True, initializer_range=args.init_std,
    )
    return LlamaForCausalLM(config)


def record_layer_outputs(layers, outputs):
    """Appends each of `layers`' outputs to `outputs` at every forward call; the hook handles."""
    return [
        layer.register_forward_hook(lambda _m, _i, out: outputs.append(out[0] if isinstance(out, tuple) else out))
        for layer in layers
    ]


class Batches:
    """Training windows: text from a verse start, repeated random tokens, repeated passages."""

    def __init__(self, ids, starts, repeat_ids, generator):
        self.ids, self.repeat_ids, self.generator = ids, repeat_ids, generator
        self.starts = starts[starts < len(ids) - CONTEXT - 1]

    def randint(self, low, high, size=()):
        return torch.randint(low, high, size, generator=self.generator)

    def text(self):
        start = self.starts[self.randint(0, len(self.starts))]
        return self.ids[start : start + CONTEXT + 1]

    def repeated(self, piece):
        """`EOS` then `piece` repeated until the window is full."""
        reps = math.ceil(CONTEXT / len(piece))
        return torch.cat([torch.tensor([EOS]), piece.repeat(reps)])[: CONTEXT + 1]

    def random_repeat(self, ids=None):
        """Distinct random ids (from `ids`, default the repeat ids), repeated."""
        ids = self.repeat_ids if ids is None else ids
        period = int(self.randint(6, min(48, len(ids) + 1)))
        piece = ids[torch.randperm(len(ids), generator=self.generator)[:period]]
        return self.repeated(piece)

    def passage_repeat(self):
        period = int(self.randint(6, 48))
        start = int(self.randint(0, len(self.ids) - period))
        return self.repeated(self.ids[start : start + period])

    def batch(self, size, text_share):
        rows = []
        for _ in range(size):
            draw = float(torch.rand((), generator=self.generator))
            if draw < text_share:
                rows.append(self.text())
            elif draw < text_share + (1 - text_share) * 0.7:
                rows.append(self.random_repeat())
            else:
                rows.append(self.passage_repeat())
        return torch.stack(rows)


def report(model, step, loss, repeat_ids, began):
    """One progress line: the loss and the best head's induction score."""
    scores = induction_scores(model, repeat_ids, torch.Generator().manual_seed(1))
    best = scores.flatten().argmax()
    layer, head = divmod(int(best), scores.shape[1])
    print(
        f"step {step} loss {loss:.3f} induction {scores.max().item():.2f} "
        f"(layer {layer} head {head}) {time.time() - began:.0f}s",
        flush=True,
    )
    return scores.max().item()


def train_induction(model, batches, args, began):
    """Phase 1: repeated random sequences only, the loss over the repeat ids (cheap steps),
    until some head is an induction head."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)
    stages = [batches.repeat_ids[:size] for size in args.induction_stages]
    stage = 0
    ids = stages[0]
    to_repeat = torch.full((EOS + 1,), -100)
    to_repeat[ids] = torch.arange(len(ids))
    for step in range(args.induction_steps):
        window = torch.stack([batches.random_repeat(ids) for _ in range(args.batch)])
        hidden = model.base_model(window[:, :-1]).last_hidden_state
        logits = hidden @ model.get_input_embeddings().weight[ids].T
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), to_repeat[window[:, 1:]].flatten())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0 and report(model, step, loss.item(), ids, began) >= 0.6:
            if stage + 1 == len(stages):
                return
            stage += 1
            ids = stages[stage]
            to_repeat = torch.full((EOS + 1,), -100)
            to_repeat[ids] = torch.arange(len(ids))
            print(f"stage {stage}: {len(ids)} ids")


def induction_scores(model, repeat_ids, generator, period=23, samples=8):
    """Per layer and head: the mean attention from each token of a repeat to the token that
    followed its previous occurrence (the induction head's target)."""
    period = min(period, len(repeat_ids))
    order = torch.stack([torch.randperm(len(repeat_ids), generator=generator)[:period] for _ in range(samples)])
    pieces = repeat_ids[order]
    prompt = torch.cat([torch.full((samples, 1), EOS), pieces, pieces, pieces[:, :20]], dim=1)
    return induction_scores_of(model, prompt, period)


def induction_scores_of(model, prompt, period):
    """Per layer and head, for `prompt` (`EOS` then a sequence repeating every `period`
    tokens): the mean attention from each repeated token to the token after its previous
    occurrence."""
    with torch.no_grad():
        attentions = model(prompt, output_attentions=True).attentions
    queries = torch.arange(period + 1, prompt.shape[1])
    scores = []
    for layer in attentions:
        target = layer[:, :, queries, queries - period + 1]
        scores.append(target.mean(dim=(0, 2)))
    return torch.stack(scores)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--text", help="the KJV as `bible -l 100000` lists it (default: run `bible`)")
    parser.add_argument("--references-only", action="store_true",
                        help="only write the references for the model already in --out")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--full-vocab-steps", type=int, default=200)
    parser.add_argument("--induction-steps", type=int, default=3000)
    parser.add_argument("--induction-stages", type=int, nargs="+", default=[16, 64, 256, 1000])
    parser.add_argument("--init-std", type=float, default=0.1)
    parser.add_argument("--shortlist", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--early-exit", type=float, default=0.5,
                        help="weight of the earlier layers' loss through the final norm and head")
    parser.add_argument("--text-share", type=float, default=0.6)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(args.seed)

    ids, starts = tokenize(kjv_verses(args.text))
    counts = torch.bincount(ids, minlength=EOS + 1)
    counts[EOS] = counts.max()
    # The shortlist: the most frequent ids (98 % of the text); rarer targets wait for the
    # full-vocabulary steps. Random repeats draw from the shortlist: its embeddings are trained.
    active = counts.argsort(descending=True)[: args.shortlist]
    repeat_ids = active[1 : 1 + max(args.induction_stages)]
    print(f"{len(ids)} tokens, {int((counts > 0).sum())} distinct ids, shortlist {len(active)}")
    to_active = torch.full((EOS + 1,), -100)
    to_active[active] = torch.arange(len(active))
    if args.references_only:
        write_references(args.out, repeat_ids, REFERENCES)
        return
    batches = Batches(ids, starts, repeat_ids, generator)

    model = build_model(args)
    model.config._attn_implementation = "eager"
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.98),
    )
    total = args.steps + args.full_vocab_steps
    warmup = 100

    def learning_rate(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    began = time.time()
    train_induction(model, batches, args, began)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate)
    early_outputs = []
    record_layer_outputs(model.model.layers[:-1], early_outputs)
    for step in range(total):
        window = batches.batch(args.batch, args.text_share)
        inputs, targets = window[:, :-1], window[:, 1:]
        early_outputs.clear()
        hidden = model.base_model(inputs).last_hidden_state
        embedding = model.get_input_embeddings().weight
        if step < args.steps:
            head = embedding[active]
            targets = to_active[targets]
        else:
            head = embedding
        final = torch.nn.functional.cross_entropy((hidden @ head.T).flatten(0, 1), targets.flatten())
        loss = final
        if step < args.steps and args.early_exit > 0:
            # The early-exit loss on every fourth position: each earlier layer read through the
            # final norm and head. Without it the lens stayed near uniform until the last layer.
            early = [
                torch.nn.functional.cross_entropy(
                    (model.model.norm(output[:, 3::4]) @ head.T).flatten(0, 1), targets[:, 3::4].flatten()
                )
                for output in early_outputs
            ]
            loss = final + args.early_exit * torch.stack(early).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == total - 1:
            report(model, step, final.item(), repeat_ids, began)

    save(model, args.out)
    write_references(args.out, repeat_ids, REFERENCES)


def save(model, out):
    """The model in float16 with GPT-2's tokenizer, as `from_pretrained` and hookscope load it."""
    model.config.dtype = "float16"
    model.half().save_pretrained(out)
    shutil.copy(TOKENIZER, out / "tokenizer.json")
    print(f"saved {out}")


def layer_log_probs(model, ids):
    """The logit lens: per layer, the mean log-probability the final norm and head give each
    next token when applied to that layer's output."""
    outputs = []
    hooks = record_layer_outputs(model.model.layers, outputs)
    with torch.no_grad():
        model(ids)
    for hook in hooks:
        hook.remove()
    targets = ids[:, 1:, None]
    means = []
    for hidden in outputs:
        log_probs = model.lm_head(model.model.norm(hidden)).log_softmax(-1)[:, :-1]
        means.append(log_probs.gather(-1, targets).mean().item())
    return means


def write_references(out, repeat_ids, path):
    """What `conformance/tests/checks/demo_model.rs` checks hookscope against: `transformers` in
    float32 on the stored float16 weights."""
    model = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    continuations = []
    for prompt in CONTINUATION_PROMPTS:
        ids = torch.tensor([tokenizer.encode(prompt).ids])
        with torch.no_grad():
            output = model.generate(ids, max_new_tokens=12, do_sample=False)
        new_ids = output[0, ids.shape[1]:].tolist()
        continuations.append({"prompt": prompt, "new_ids": new_ids, "text": tokenizer.decode(new_ids)})
        print(f"{prompt!r} -> {tokenizer.decode(new_ids)!r}")
    # A repeated sequence of distinct random ids the induction phase never scored on.
    generator = torch.Generator().manual_seed(2026)
    period = 29
    pieces = torch.stack([repeat_ids[torch.randperm(len(repeat_ids), generator=generator)[:period]] for _ in range(3)])
    prompt = torch.cat([torch.full((3, 1), EOS), pieces, pieces], dim=1)
    scores = induction_scores_of(model, prompt, period)
    print(f"induction scores (layer x head):\n{scores}")
    verse = torch.tensor([tokenizer.encode(LENS_PROMPT).ids])
    lens = layer_log_probs(model, verse)
    print(f"logit lens, mean log-prob of the next token per layer: {lens}")
    path.write_text(json.dumps({
        "continuations": continuations,
        "induction": {"prompt": prompt.tolist(), "period": period, "scores": scores.tolist()},
        "lens": {"prompt": LENS_PROMPT, "mean_log_prob": lens},
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
