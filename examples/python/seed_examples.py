# %% [markdown]
# # hookscope from Python: the seed's three snippets
#
# Run as a script (`python examples/python/seed_examples.py`) or cell by cell in a notebook
# (the `# %%` markers). Needs `pip install ./crates/python matplotlib`. Uses the embedded default
# model (a small Llama trained on the King James Bible, with GPT-2's tokenizer); pass a
# directory or hub id to `hookscope.Model`, e.g. a local copy of openai-community/gpt2.

# %%
import matplotlib

matplotlib.use("Agg")  # write files; drop this line in a notebook
import matplotlib.pyplot as plt

import hookscope

model = hookscope.Model()
prompt = "The Eiffel Tower is in the city of"

# %% [markdown]
# ## 1. Values at every step; the argmax of `next_token_probs` is the appended token

# %%
g = model.generate(prompt, max_new_tokens=3, greedy=True, save=["layers.1.layer_output", "next_token_probs"])
print([g.saved[f"layers.1.layer_output@{k}"].shape for k in range(3)])
print([int(g.saved[f"next_token_probs@{k}"].argmax(-1)[0]) for k in range(3)], g.output_ids[0, -3:].tolist(), repr(g.new_text[0]))

# %% [markdown]
# ## 2. A decode step: the new token's input, the whole cache, and what it attends to

# %%
g = model.generate(
    prompt,
    max_new_tokens=3,
    greedy=True,
    save=[
        "input_ids@1",
        "layers.1.self_attn.attention_keys@1",
        "layers.1.self_attn.attention_probabilities@1",
        "layers.1.layer_output@1",
    ],
)
print(
    g.saved["input_ids@1"].tolist(),
    g.saved["layers.1.self_attn.attention_keys@1"].shape,
    g.saved["layers.1.self_attn.attention_probabilities@1"].shape,
    g.saved["layers.1.layer_output@1"].shape,
)

# %% [markdown]
# ## 3. A write at step 1 reaches that step and every later one

# %%
zeroed = model.generate(prompt, max_new_tokens=3, greedy=True, zero=["layers.1.layer_output@1"])
print(repr(g.new_text[0]), "->", repr(zeroed.new_text[0]))

# %% [markdown]
# ## An attention pattern

# %%
t = model.trace(prompt, save=["layers.1.self_attn.attention_probabilities"])
pattern = t.saved["layers.1.self_attn.attention_probabilities@0"][0]  # [heads, T, T]
tokens = [model.decode([int(i)]) for i in t.output_ids[0]]
fig, axes = plt.subplots(1, pattern.shape[0], figsize=(4 * pattern.shape[0], 4))
for head, ax in enumerate(axes):
    ax.imshow(pattern[head], cmap="viridis", vmin=0, vmax=1)
    ax.set_title(f"layer 1, head {head}")
    ax.set_xticks(range(len(tokens)), tokens, rotation=90)
    ax.set_yticks(range(len(tokens)), tokens)
fig.tight_layout()
fig.savefig("attention.png")
print("wrote attention.png")
