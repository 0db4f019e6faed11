#!/opt/gradaccum/venv/bin/python
"""@generated golden values for tests/bloom_test.cpp — generated with Debian's
python3-torch (torch 1.13); rerun with the venv's: /opt/gradaccum/venv/bin/python tests/data/gen_bloom_golden.py

BLOOM's forward (HF modeling_bloom, re-implemented here in plain torch from its
definition; transformers is not needed) in float64 for a tiny config with a
head count that is not a power of two (6: ALiBi's extra slopes), on one batch
padded on the right and the same rows padded on the left. Writes the config,
every parameter under its HF name, the batches and the logits.

The weights are seeded normals rounded to multiples of 1/256, so the decimal
numbers in the JSON are exactly the float64 (and float32) values used here.
LayerNorm weights and biases are random too, so that a swapped or skipped
LayerNorm changes the logits."""
import json
import math

import torch

torch.set_default_dtype(torch.float64)
generator = torch.Generator().manual_seed(20240521)

CONFIG = {"vocab_size": 40, "hidden_size": 12, "n_layer": 2, "n_head": 6,
          "layer_norm_epsilon": 1e-5}
V, C, L, H = (CONFIG[k] for k in ("vocab_size", "hidden_size", "n_layer", "n_head"))
D = C // H


def draw(*shape, std=0.3, mean=0.0):
    x = mean + std * torch.randn(*shape, generator=generator)
    return torch.round(x * 256) / 256


params = {"transformer.word_embeddings.weight": draw(V, C, std=0.5),
          "transformer.word_embeddings_layernorm.weight": draw(C, std=0.2, mean=1.0),
          "transformer.word_embeddings_layernorm.bias": draw(C, std=0.2)}
for i in range(L):
    p = f"transformer.h.{i}."
    params[p + "input_layernorm.weight"] = draw(C, std=0.2, mean=1.0)
    params[p + "input_layernorm.bias"] = draw(C, std=0.2)
    # Linear weights [out, in] as nn.Linear (and HF checkpoints) store them.
    params[p + "self_attention.query_key_value.weight"] = draw(3 * C, C, std=0.5)
    params[p + "self_attention.query_key_value.bias"] = draw(3 * C, std=0.2)
    params[p + "self_attention.dense.weight"] = draw(C, C)
    params[p + "self_attention.dense.bias"] = draw(C, std=0.1)
    params[p + "post_attention_layernorm.weight"] = draw(C, std=0.2, mean=1.0)
    params[p + "post_attention_layernorm.bias"] = draw(C, std=0.2)
    params[p + "mlp.dense_h_to_4h.weight"] = draw(4 * C, C)
    params[p + "mlp.dense_h_to_4h.bias"] = draw(4 * C, std=0.1)
    params[p + "mlp.dense_4h_to_h.weight"] = draw(C, 4 * C, std=0.2)
    params[p + "mlp.dense_4h_to_h.bias"] = draw(C, std=0.1)
params["transformer.ln_f.weight"] = draw(C, std=0.2, mean=1.0)
params["transformer.ln_f.bias"] = draw(C, std=0.2)


def alibi_slopes(n_head):
    # p = the largest power of two <= n_head; base^1..base^p, then the odd
    # powers of the base for 2p heads.
    p = 2 ** math.floor(math.log2(n_head))
    base = 2.0 ** (-(2.0 ** -(math.log2(p) - 3)))
    slopes = [base ** k for k in range(1, p + 1)]
    extra = 2.0 ** (-(2.0 ** -(math.log2(2 * p) - 3)))
    slopes += [extra ** k for k in range(1, 2 * (n_head - p), 2)]
    return torch.tensor(slopes)


def layer_norm(x, name):
    return torch.nn.functional.layer_norm(x, (C,), params[name + ".weight"], params[name + ".bias"],
                                          CONFIG["layer_norm_epsilon"])


def linear(x, name):
    return x @ params[name + ".weight"].T + params[name + ".bias"]


def gelu_tanh(x):
    # BLOOM's GELU: the tanh approximation with sqrt(2/pi) written as 0.79788456.
    return 0.5 * x * (1.0 + torch.tanh(0.79788456 * (x + 0.044715 * x ** 3)))


def forward(ids, mask):
    B, T = ids.shape
    x = params["transformer.word_embeddings.weight"][ids]
    x = layer_norm(x, "transformer.word_embeddings_layernorm")
    # ALiBi: slope_h * key position, positions counted over real tokens only.
    positions = (mask.cumsum(-1) - 1) * mask                         # [B, T]
    alibi = alibi_slopes(H).view(1, H, 1, 1) * positions.view(B, 1, 1, T).to(x.dtype)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    allowed = causal.view(1, 1, T, T) & mask.bool().view(B, 1, 1, T)
    for i in range(L):
        p = f"transformer.h.{i}."
        h = layer_norm(x, p + "input_layernorm")
        fused = linear(h, p + "self_attention.query_key_value").view(B, T, H, 3, D)
        q, k, v = (fused[:, :, :, j].transpose(1, 2) for j in range(3))   # [B, H, T, D]
        scores = alibi + (q @ k.transpose(-1, -2)) / math.sqrt(D)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        y = torch.softmax(scores, -1) @ v
        y = y.transpose(1, 2).reshape(B, T, C)
        x = x + linear(y, p + "self_attention.dense")
        h = layer_norm(x, p + "post_attention_layernorm")
        x = x + linear(gelu_tanh(linear(h, p + "mlp.dense_h_to_4h")), p + "mlp.dense_4h_to_h")
    x = layer_norm(x, "transformer.ln_f")
    return x @ params["transformer.word_embeddings.weight"].T          # tied LM head


lengths = [7, 3, 5]
T = max(lengths)
rows = [torch.randint(1, V, (n,), generator=generator) for n in lengths]
out = {"config": CONFIG, "lengths": lengths,
       "params": {k: v.reshape(-1).tolist() for k, v in params.items()}}
for side in ("right", "left"):
    ids = torch.zeros(len(rows), T, dtype=torch.long)   # pad id 0
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        begin = T - len(r) if side == "left" else 0
        ids[i, begin:begin + len(r)] = r
        mask[i, begin:begin + len(r)] = 1
    out[side] = {"input_ids": ids.tolist(), "attention_mask": mask.tolist(),
                 "logits": forward(ids, mask).reshape(-1).tolist()}

with open(__file__.replace("gen_bloom_golden.py", "bloom_golden.json"), "w") as f:
    json.dump(out, f)
