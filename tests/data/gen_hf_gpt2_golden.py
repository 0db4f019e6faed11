#!/opt/gradaccum/venv/bin/python
"""@generated golden files for tests/hf_checkpoint_test.cpp — generated with Debian's
python3-torch (torch 1.13); rerun with the venv's: /opt/gradaccum/venv/bin/python tests/data/gen_hf_gpt2_golden.py

An implementation independent of the C++ one: a tiny GPT-2 checkpoint in Hugging
Face's own layout and the logits of HF's GPT-2 forward, re-implemented here in
plain torch (transformers is not installed).

Writes tests/data/hf_gpt2/:
  config.json        HF GPT2Config fields, architectures ["GPT2LMHeadModel"]
  model.safetensors  HF tensor names with the `transformer.` prefix, Conv1D
                     weights stored [in, out], no lm_head.weight (tied to wte),
                     and the old non-parameter buffers h.<i>.attn.bias (causal
                     mask) and h.<i>.attn.masked_bias that loaders must ignore;
                     written by the minimal safetensors writer below
                     (JSON header padded to 8 bytes + raw little-endian bytes)
  golden.json        input_ids, attention_mask (unpadded, right- and left-
                     padded rows) and the logits [B, T, V] in float64, computed
                     from the float32 weights

Position ids under padding follow HF's generate(): cumsum(mask) - 1, padding 1.
Logits at padding positions are not meaningful (HF and gradaccum mask a query
that sees no real key differently) and the test ignores them."""
import json
import math
import os
import struct

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_gpt2")
VOCAB, N_POSITIONS, N_EMBD, N_LAYER, N_HEAD, EPS = 64, 16, 16, 2, 2, 1e-5

torch.manual_seed(20240611)


def rand(*shape, std=0.3):
    return (torch.randn(*shape, dtype=torch.float64) * std).to(torch.float32)


# Weights far from HF's small init (std 0.02) so every term moves the logits.
C = N_EMBD
weights = {
    "transformer.wte.weight": rand(VOCAB, C, std=0.5),
    "transformer.wpe.weight": rand(N_POSITIONS, C, std=0.5),
    "transformer.ln_f.weight": 1 + rand(C, std=0.2),
    "transformer.ln_f.bias": rand(C, std=0.2),
}
for i in range(N_LAYER):
    p = f"transformer.h.{i}."
    weights.update({
        p + "ln_1.weight": 1 + rand(C, std=0.2),
        p + "ln_1.bias": rand(C, std=0.2),
        p + "attn.c_attn.weight": rand(C, 3 * C),      # Conv1D: [in, out]
        p + "attn.c_attn.bias": rand(3 * C, std=0.1),
        p + "attn.c_proj.weight": rand(C, C),
        p + "attn.c_proj.bias": rand(C, std=0.1),
        p + "ln_2.weight": 1 + rand(C, std=0.2),
        p + "ln_2.bias": rand(C, std=0.2),
        p + "mlp.c_fc.weight": rand(C, 4 * C),
        p + "mlp.c_fc.bias": rand(4 * C, std=0.1),
        p + "mlp.c_proj.weight": rand(4 * C, C),
        p + "mlp.c_proj.bias": rand(C, std=0.1),
    })
buffers = {}
for i in range(N_LAYER):
    buffers[f"transformer.h.{i}.attn.bias"] = torch.tril(
        torch.ones(N_POSITIONS, N_POSITIONS, dtype=torch.uint8)).view(1, 1, N_POSITIONS, N_POSITIONS)
    buffers[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4, dtype=torch.float32)


def write_safetensors(path, tensors):
    dtypes = {torch.float32: "F32", torch.uint8: "U8"}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().numpy().tobytes()  # x86: little-endian
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def layer_norm(x, name):
    return torch.nn.functional.layer_norm(x, (C,), weights[name + ".weight"].double(),
                                          weights[name + ".bias"].double(), EPS)


def conv1d(x, name):  # HF's Conv1D: x @ W[in, out] + b
    return x @ weights[name + ".weight"].double() + weights[name + ".bias"].double()


def gelu_new(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(input_ids, attention_mask):
    """HF GPT2LMHeadModel.forward in float64, with generate()'s position ids."""
    B, T = input_ids.shape
    D = C // N_HEAD
    position_ids = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    h = weights["transformer.wte.weight"].double()[input_ids] + \
        weights["transformer.wpe.weight"].double()[position_ids]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    additive = (1.0 - attention_mask.double())[:, None, None, :] * torch.finfo(torch.float64).min
    for i in range(N_LAYER):
        p = f"transformer.h.{i}."
        q, k, v = conv1d(layer_norm(h, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = (t.view(B, T, N_HEAD, D).transpose(1, 2) for t in (q, k, v))
        w = q @ k.transpose(-1, -2) / math.sqrt(D)
        w = torch.where(causal, w, torch.tensor(torch.finfo(torch.float64).min, dtype=torch.float64))
        w = torch.softmax(w + additive, dim=-1)
        a = (w @ v).transpose(1, 2).reshape(B, T, C)
        h = h + conv1d(a, p + "attn.c_proj")
        m = conv1d(gelu_new(conv1d(layer_norm(h, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
        h = h + m
    h = layer_norm(h, "transformer.ln_f")
    return h @ weights["transformer.wte.weight"].double().T  # tied head


T = 8
g = torch.Generator().manual_seed(7)
input_ids = torch.randint(1, VOCAB, (3, T), generator=g)
attention_mask = torch.ones(3, T, dtype=torch.long)
attention_mask[1, 5:] = 0   # right padding: 5 real tokens
attention_mask[2, :3] = 0   # left padding: 5 real tokens
input_ids = input_ids.masked_fill(attention_mask == 0, 0)
logits = forward(input_ids, attention_mask)

os.makedirs(OUT, exist_ok=True)
write_safetensors(os.path.join(OUT, "model.safetensors"), {**weights, **buffers})
config = {
    "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
    "vocab_size": VOCAB, "n_positions": N_POSITIONS, "n_embd": N_EMBD, "n_layer": N_LAYER,
    "n_head": N_HEAD, "n_inner": None, "activation_function": "gelu_new",
    "layer_norm_epsilon": EPS, "initializer_range": 0.02, "resid_pdrop": 0.1,
    "embd_pdrop": 0.1, "attn_pdrop": 0.1, "scale_attn_weights": True, "use_cache": True,
    "bos_token_id": 50256, "eos_token_id": 50256, "torch_dtype": "float32",
}
with open(os.path.join(OUT, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
with open(os.path.join(OUT, "golden.json"), "w") as f:
    json.dump({"@generated": "by tests/data/gen_hf_gpt2_golden.py",
               "input_ids": input_ids.tolist(), "attention_mask": attention_mask.tolist(),
               "logits": logits.reshape(-1).tolist()}, f)
    f.write("\n")
