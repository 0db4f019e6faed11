#!/opt/gradaccum/venv/bin/python
"""Reference models for tests/models/hf_interop_test.cpp, made by Hugging Face transformers itself.

For each case below: a random-init GPT-2 or BLOOM model (causal LM or sequence classifier,
shapes other than the defaults) written with `save_pretrained` into OUT/<case>/ (config.json +
model.safetensors, exactly as transformers writes them), and OUT/<case>/reference.safetensors
with a padded batch and transformers' own logits on it:
  input_ids, attention_mask  [3, T] int64: row 0 unpadded, row 1 right-padded (3), row 2
                             left-padded (2); padding holds the pad id
  position_ids               [3, T]: cumsum(mask) - 1, 1 at padding (GPT-2; what generate()
                             passes and what gradaccum computes from the mask)
  logits64, logits32         the model's logits with its weights in float64 / float32
                             (eager attention); [3, T, V] for a causal LM, [3, labels] for a
                             classifier (pooled at the last non-pad token)
transformers' BLOOM computes its attention softmax in float32 even for a float64 model; for
logits64 it runs in float64 (see _Float64Softmax). Every weight is redrawn (biases and LayerNorm gains too: transformers initializes those to 0 and 1,
which would hide a transposed or swapped tensor). OUT/cases.json lists the cases. A case with
"refused" holds a checkpoint gradaccum must refuse with that text in its one-line error.

  /opt/gradaccum/venv/bin/python tests/hf/save_pretrained_models.py OUT
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import (BloomConfig, BloomForCausalLM, BloomForSequenceClassification, GPT2Config,
                          GPT2LMHeadModel, GPT2ForSequenceClassification)

CASES = [
    # name, architecture, labels, config
    ("gpt2-lm-3h24", "gpt2", 0, dict(vocab_size=50, n_positions=16, n_embd=24, n_layer=2, n_head=3)),
    ("gpt2-lm-4h32-3l", "gpt2", 0, dict(vocab_size=61, n_positions=20, n_embd=32, n_layer=3, n_head=4)),
    ("gpt2-cls-2h16", "gpt2", 3, dict(vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                      pad_token_id=0)),
    ("bloom-lm-4h32", "bloom", 0, dict(vocab_size=50, hidden_size=32, n_layer=2, n_head=4)),
    ("bloom-lm-2h24-3l", "bloom", 0, dict(vocab_size=45, hidden_size=24, n_layer=3, n_head=2)),
    ("bloom-cls-4h16", "bloom", 2, dict(vocab_size=40, hidden_size=16, n_layer=2, n_head=4,
                                        pad_token_id=3)),
    # Untied heads (their own lm_head.weight), which HF allows for both.
    ("gpt2-lm-untied", "gpt2", 0, dict(vocab_size=50, n_positions=16, n_embd=24, n_layer=2, n_head=3,
                                       tie_word_embeddings=False)),
    ("bloom-lm-untied", "bloom", 0, dict(vocab_size=45, hidden_size=24, n_layer=2, n_head=3,
                                         tie_word_embeddings=False)),
]
# HF allows GPT-2's attention scaled by 1 / (layer index + 1); gradaccum's GPT-2 does not, and says so.
REFUSED = [
    ("gpt2-lm-scaled-by-layer", "gpt2", 0, dict(vocab_size=50, n_positions=16, n_embd=24, n_layer=2, n_head=3,
                                                scale_attn_by_inverse_layer_idx=True),
     '"scale_attn_by_inverse_layer_idx" is true; this model supports only false'),
]
PAD_DEFAULT = 0
TIME = 9


def build(arch, labels, kwargs):
    if arch == "gpt2":
        config = GPT2Config(**kwargs, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            num_labels=max(labels, 2))
        cls = GPT2ForSequenceClassification if labels else GPT2LMHeadModel
    else:
        config = BloomConfig(**kwargs, hidden_dropout=0.0, attention_dropout=0.0,
                             num_labels=max(labels, 2))
        cls = BloomForSequenceClassification if labels else BloomForCausalLM
    config._attn_implementation = "eager"
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_gain = name.endswith("weight") and ("ln" in name or "layernorm" in name)
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if is_gain else 0.3 * torch.randn_like(p))
    return model


def batch(vocab, pad):
    ids = torch.randint(4, vocab, (3, TIME))  # real tokens never equal a pad id (< 4)
    mask = torch.ones(3, TIME, dtype=torch.long)
    mask[1, TIME - 3:] = 0
    mask[2, :2] = 0
    ids[mask == 0] = pad
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    return ids, mask, positions


class _Float64Softmax:
    """transformers' BLOOM attention calls F.softmax(..., dtype=torch.float32) whatever the model's
    dtype (meant as an upcast from 16 bits). For the float64 reference it runs in float64 instead:
    otherwise the reference is float32-accurate only, and a left-padded row turns NaN (float64's
    lowest mask value overflows to -inf in float32)."""

    def __getattr__(self, name):
        return getattr(torch.nn.functional, name)

    @staticmethod
    def softmax(x, dim=None, dtype=None, **kwargs):
        if x.dtype == torch.float64:
            dtype = None
        return torch.nn.functional.softmax(x, dim=dim, dtype=dtype, **kwargs)


def run(model, arch, ids, mask, positions, **kwargs):
    """The model's output on the batch (kwargs: e.g. labels), float64 BLOOM softmax in float64."""
    with torch.no_grad():
        extra = {"position_ids": positions} if arch == "gpt2" else {}
        if arch == "bloom" and next(model.parameters()).dtype == torch.float64:
            import transformers.models.bloom.modeling_bloom as modeling_bloom
            saved, modeling_bloom.F = modeling_bloom.F, _Float64Softmax()
            try:
                return model(input_ids=ids, attention_mask=mask, **extra, **kwargs)
            finally:
                modeling_bloom.F = saved
        return model(input_ids=ids, attention_mask=mask, **extra, **kwargs)


def logits(model, arch, ids, mask, positions):
    return run(model, arch, ids, mask, positions).logits


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    listed = []
    for seed, (name, arch, labels, kwargs) in enumerate(CASES):
        torch.manual_seed(1000 + seed)
        model = build(arch, labels, kwargs)
        model.save_pretrained(os.path.join(out, name))
        ids, mask, positions = batch(kwargs["vocab_size"], kwargs.get("pad_token_id", PAD_DEFAULT))
        l32 = logits(model, arch, ids, mask, positions)
        l64 = logits(model.double(), arch, ids, mask, positions)
        save_file({"input_ids": ids, "attention_mask": mask, "position_ids": positions,
                   "logits32": l32.contiguous(), "logits64": l64.contiguous()},
                  os.path.join(out, name, "reference.safetensors"))
        listed.append({"name": name, "architecture": arch, "labels": labels})
    for name, arch, labels, kwargs, error in REFUSED:
        torch.manual_seed(2000)
        build(arch, labels, kwargs).save_pretrained(os.path.join(out, name))
        listed.append({"name": name, "architecture": arch, "labels": labels, "refused": error})
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(listed, f, indent=1)


if __name__ == "__main__":
    main()
