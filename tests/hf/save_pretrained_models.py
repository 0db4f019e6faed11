#!/opt/gradaccum/venv/bin/python
"""Reference models for tests/models/hf_interop_test.cpp, made by Hugging Face transformers itself.

For each case below: a random-init model of one architecture (GPT-2, BLOOM, Llama, Qwen2, Qwen3,
Mistral; causal LM or sequence classifier, shapes other than the defaults) written with
`save_pretrained` into OUT/<case>/ (config.json + model.safetensors, exactly as transformers
writes them; a "legacy" case then rewrites its RoPE settings into the top-level rope_theta +
rope_scaling spelling of most published checkpoints, and a "sharded" case splits its weights into
shards with model.safetensors.index.json), and OUT/<case>/reference.safetensors with a padded
batch and transformers' own logits on it:
  input_ids, attention_mask  [3, T] int64: row 0 unpadded, row 1 right-padded (3), row 2
                             left-padded (2); padding holds the pad id
  position_ids               [3, T]: cumsum(mask) - 1, 1 at padding (GPT-2 and the Llama family:
                             what generate() passes and what gradaccum computes from the mask)
  logits64, logits32         the model's logits with its weights in float64 / float32
                             (eager attention); [3, T, V] for a causal LM, [3, labels] for a
                             classifier (pooled at the last non-pad token)
transformers' BLOOM computes its attention softmax in float32 even for a float64 model; for
logits64 it runs in float64 (see _Float64Softmax). Its Llama family computes RMSNorm, RoPE's
angles and the attention softmax in float32 whatever the dtype; for logits64 they run in float64
(see llama_family_in_float64). Every weight is redrawn (biases and norm gains too: transformers
initializes those to 0 and 1, which would hide a transposed or swapped tensor). OUT/cases.json
lists the cases. A case with "refused" holds a checkpoint gradaccum must refuse with that text in
its one-line error. OUT/rope.safetensors and OUT/rope.json hold transformers' RoPE inverse
frequencies (computed in float64) for each scaling type, for gradaccum's to be compared with.

  /opt/gradaccum/venv/bin/python tests/hf/save_pretrained_models.py OUT
"""
import contextlib
import json
import os
import sys
import types

import torch
from safetensors.torch import load_file, save_file
from transformers import (BloomConfig, BloomForCausalLM, BloomForSequenceClassification, GPT2Config,
                          GPT2LMHeadModel, GPT2ForSequenceClassification, LlamaConfig, LlamaForCausalLM,
                          LlamaForSequenceClassification, MistralConfig, MistralForCausalLM,
                          MistralForSequenceClassification, Qwen2Config, Qwen2ForCausalLM,
                          Qwen2ForSequenceClassification, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3ForSequenceClassification)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# The Llama family: (config class, causal LM class, classifier class).
LLAMA_FAMILY = {
    "llama": (LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, Qwen3ForSequenceClassification),
    "mistral": (MistralConfig, MistralForCausalLM, MistralForSequenceClassification),
}
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=16)

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
    # The Llama family. Grouped-query attention with 2 and 3 query heads per key-value head;
    # RoPE's llama3 scaling in transformers 5's spelling (rope_parameters) and in the legacy one
    # (rope_theta + rope_scaling, written by rewriting config.json); an untied head (HF's default
    # for these families) and a tied one; a non-default norm eps; biases on q, k, v and o.
    ("llama-lm-gqa-llama3", "llama", 0, dict(vocab_size=61, hidden_size=32, intermediate_size=40,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=64, rms_norm_eps=1e-5,
                                             rope_parameters=dict(LLAMA3, rope_theta=500.0))),
    ("llama-lm-legacy-rope-tied-bias", "llama", 0, dict(vocab_size=50, hidden_size=48, intermediate_size=56,
                                                        num_hidden_layers=2, num_attention_heads=6,
                                                        num_key_value_heads=2, max_position_embeddings=32,
                                                        rope_parameters=dict(LLAMA3, rope_theta=10000.0),
                                                        tie_word_embeddings=True, attention_bias=True,
                                                        mlp_bias=True, legacy_rope=True)),
    # Multi-query attention with a head_dim of 4.
    ("llama-lm-mqa-small-heads", "llama", 0, dict(vocab_size=40, hidden_size=24, intermediate_size=32,
                                                  num_hidden_layers=3, num_attention_heads=6,
                                                  num_key_value_heads=1, max_position_embeddings=16,
                                                  rms_norm_eps=1e-4, sharded=True)),
    ("llama-cls-gqa", "llama", 3, dict(vocab_size=40, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                       rope_parameters=dict(LLAMA3, rope_theta=1000.0), pad_token_id=0)),
    # Qwen2: bias on q, k, v (none on o); a sliding window of 3 on the second layer only
    # (max_window_layers 1), shorter than the batch's sequences.
    ("qwen2-lm-window", "qwen2", 0, dict(vocab_size=55, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                         use_sliding_window=True, sliding_window=3, max_window_layers=1,
                                         tie_word_embeddings=True, rope_parameters=dict(rope_type="default",
                                                                                        rope_theta=100.0))),
    ("qwen2-cls", "qwen2", 2, dict(vocab_size=40, hidden_size=24, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=32,
                                   pad_token_id=3)),
    # Qwen3: RMSNorm over head_dim on q and k, an explicit head_dim (12) unequal to width / heads (8).
    ("qwen3-lm-head-dim", "qwen3", 0, dict(vocab_size=50, hidden_size=32, intermediate_size=40,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           head_dim=12, max_position_embeddings=32, rms_norm_eps=1e-5)),
    ("qwen3-cls-bias", "qwen3", 2, dict(vocab_size=40, hidden_size=24, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=3, num_key_value_heads=1, head_dim=10,
                                        max_position_embeddings=32, attention_bias=True, pad_token_id=0)),
    # Mistral: a sliding window of 4 on every layer.
    ("mistral-lm-window", "mistral", 0, dict(vocab_size=45, hidden_size=32, intermediate_size=40,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                                             max_position_embeddings=32, sliding_window=4)),
    ("mistral-cls-window", "mistral", 2, dict(vocab_size=40, hidden_size=16, intermediate_size=24,
                                              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                              max_position_embeddings=32, sliding_window=5, pad_token_id=0)),
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
    kwargs = {k: v for k, v in kwargs.items() if k not in ("legacy_rope", "sharded")}
    if arch in LLAMA_FAMILY:
        config_class, lm_class, classifier_class = LLAMA_FAMILY[arch]
        config = config_class(**kwargs, attention_dropout=0.0, num_labels=max(labels, 2))
        cls = classifier_class if labels else lm_class
    elif arch == "gpt2":
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
            is_gain = name.endswith("weight") and ("ln" in name or "norm" in name)
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


@contextlib.contextmanager
def llama_family_in_float64(model):
    """transformers' Llama family casts to float32 in three places whatever the model's dtype: RMSNorm
    (hidden_states.to(torch.float32)), RoPE (inverse frequencies and angles in float32) and the eager
    attention's softmax (dtype=torch.float32). For the float64 reference those run in float64: RMSNorm
    and the softmax without the casts, RoPE with transformers' own inverse frequencies computed with
    torch.float standing for float64 and the angles in float64. Only for a float64 model."""
    if next(model.parameters()).dtype != torch.float64:
        yield
        return
    softmax = torch.nn.functional.softmax

    def softmax64(x, dim=None, dtype=None, **kwargs):
        return softmax(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype, **kwargs)

    def rms_norm64(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rotary64(self, x, position_ids):
        freqs = position_ids[..., None].double() * self.inv_freq64
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    patched = []
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm"):
            module.forward = types.MethodType(rms_norm64, module)
            patched.append(module)
        elif name.endswith("RotaryEmbedding"):
            module.inv_freq64, _ = rope_inverse_frequencies64(module.config, module.rope_type)
            module.forward = types.MethodType(rotary64, module)
            patched.append(module)
    torch.nn.functional.softmax = softmax64
    try:
        yield
    finally:
        torch.nn.functional.softmax = softmax
        for module in patched:
            del module.forward


def rope_inverse_frequencies64(config, rope_type, seq_len=None):
    """transformers' RoPE initialization for `rope_type`, in float64: its functions make their
    channel indices with dtype=torch.float, which stands for torch.float64 here."""
    if rope_type == "default":
        base = config.rope_parameters["rope_theta"]
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)), 1.0
    saved = torch.float
    torch.float = torch.float64
    try:
        kwargs = {"seq_len": seq_len} if seq_len is not None else {}
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", **kwargs)
    finally:
        torch.float = saved
    return inv_freq.double(), scaling


def run(model, arch, ids, mask, positions, **kwargs):
    """The model's output on the batch (kwargs: e.g. labels), in float64 throughout for a float64
    model (BLOOM's softmax, the Llama family's norms, RoPE and softmax)."""
    with torch.no_grad():
        extra = {"position_ids": positions} if arch == "gpt2" or arch in LLAMA_FAMILY else {}
        if arch in LLAMA_FAMILY:
            with llama_family_in_float64(model):
                return model(input_ids=ids, attention_mask=mask, **extra, **kwargs)
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


def rewrite_rope_as_legacy(directory):
    """config.json's rope_parameters rewritten as the top-level rope_theta + rope_scaling (with
    "type", the older key) that most published checkpoints carry."""
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        config = json.load(f)
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    rope["type"] = rope.pop("rope_type")
    config["rope_scaling"] = rope
    with open(path, "w") as f:
        json.dump(config, f, indent=2)


def shard(directory):
    """model.safetensors split into two shards with model.safetensors.index.json, as transformers
    writes checkpoints larger than its max_shard_size."""
    path = os.path.join(directory, "model.safetensors")
    tensors = load_file(path)
    os.remove(path)
    names = sorted(tensors)
    parts = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, part in enumerate(parts):
        file = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in part}, os.path.join(directory, file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)


# RoPE scalings whose inverse frequencies gradaccum must reproduce: (name, head_dim,
# max_position_embeddings, seq_len for dynamic scaling, rope_parameters).
ROPE_CASES = [
    ("default", 16, 64, None, dict(rope_type="default", rope_theta=10000.0)),
    ("linear", 16, 64, None, dict(rope_type="linear", rope_theta=500.0, factor=4.0)),
    ("dynamic-within", 16, 64, 32, dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)),
    ("dynamic-beyond", 16, 64, 200, dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)),
    ("llama3", 64, 1024, None, dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0, original_max_position_embeddings=128)),
    ("yarn", 32, 4096, None, dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                  original_max_position_embeddings=1024)),
    ("yarn-mscale", 32, 4096, None, dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, mscale=0.8,
                                         mscale_all_dim=0.5, beta_fast=16.0, beta_slow=2.0,
                                         original_max_position_embeddings=512, truncate=False)),
]


def write_rope_references(out):
    tensors, listed = {}, []
    for name, head_dim, max_positions, seq_len, params in ROPE_CASES:
        config = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                             max_position_embeddings=max_positions, rope_parameters=dict(params))
        inv_freq, scaling = rope_inverse_frequencies64(config, params["rope_type"], seq_len)
        tensors[name] = inv_freq.contiguous()
        listed.append({"name": name, "head_dim": head_dim, "max_position_embeddings": max_positions,
                       "seq_len": seq_len or 0, "rope_parameters": params, "attention_scaling": scaling})
    save_file(tensors, os.path.join(out, "rope.safetensors"))
    with open(os.path.join(out, "rope.json"), "w") as f:
        json.dump(listed, f, indent=1)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    write_rope_references(out)
    listed = []
    for seed, (name, arch, labels, kwargs) in enumerate(CASES):
        torch.manual_seed(1000 + seed)
        model = build(arch, labels, kwargs)
        model.save_pretrained(os.path.join(out, name))
        if kwargs.get("legacy_rope"):
            rewrite_rope_as_legacy(os.path.join(out, name))
        if kwargs.get("sharded"):
            shard(os.path.join(out, name))
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
