#!/opt/gradaccum/venv/bin/python
"""transformers' GGUF loader (with the PyPI package `gguf`) as the reference for gradaccum's GGUF
checkpoints and tokenizers (tests/models/gguf_checkpoint_test.cpp, tests/data/gguf_tokenizer_test.cpp).

Usage:
  gguf_transformers_reference.py model MODEL.gguf DIR
      AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=torch.float32) (~30 s for
      SmolLM2-135M on 2 cores) and AutoTokenizer.from_pretrained(dir, gguf_file=name):
      DIR/tokenizer/tokenizer.json: the tokenizer.json transformers writes for MODEL;
      DIR/reference.safetensors: input_ids and attention_mask of TEXTS tokenized and right-padded
      (pad: the tokenizer's pad id), and transformers' float32 logits on them;
      DIR/greedy.json: PROMPT's ids and transformers' greedy continuation of it (generate with
      do_sample=False, GREEDY_TOKENS new tokens): its ids and its text as `tokenizers` decodes them.
  gguf_transformers_reference.py tokenizer MODEL.gguf DIR
      DIR/tokenizer/tokenizer.json only (~10 s).
  gguf_transformers_reference.py tokenizers DIR
      Small GGUF tokenizers written by gguf's GGUFWriter (byte characters, merges of a few words,
      control and user-defined tokens, a token outside the byte characters), each with the
      tokenizer.json transformers makes of it: DIR/<case>.gguf and DIR/<case>/tokenizer.json for
      the pre-tokenizers smollm, llama-bpe and qwen2 (tok-smollm, tok-llama-bpe, tok-qwen2); and
      files gradaccum must refuse: DIR/bad-pre-tokenizer.gguf (an unknown tokenizer.ggml.pre),
      DIR/bad-model.gguf (tokenizer.ggml.model "llama").
  gguf_transformers_reference.py models DIR
      DIR/tiny-llama.gguf: a 2-block Llama (4 query / 2 key-value heads of 8, an untied head,
      weights in Q8_0, F16 and F32) with the tok-smollm tokenizer; DIR/tiny-llama.safetensors:
      input_ids and attention_mask of three texts, right-padded, and transformers' float32 logits;
      DIR/tiny-llama-head-dim.gguf and .safetensors: the same with an explicit head size of 12
      (llama.attention.key_length / value_length, unequal to width / heads) and no output tensor
      (tied); DIR/tiny-llama-rope-linear.gguf: linear RoPE scaling (factor 4) and no
      llama.vocab_size (the vocabulary is the tokenizer's tokens), for its config only (transformers'
      loader reads no llama.rope.scaling.* keys); DIR/tiny-llama-rope-yarn.gguf and .safetensors:
      YaRN (factor 4, original context 16, beta_fast 16, beta_slow 2), its logits from transformers
      with those rope_parameters on the file's weights;
      and files gradaccum must refuse: DIR/bad-architecture.gguf (general.architecture "gpt2"),
      DIR/bad-missing-key.gguf (no llama.embedding_length), DIR/bad-shape.gguf (blk.1.attn_k.weight
      one column short), DIR/bad-rope-yarn-log-multiplier.gguf (a YaRN key gradaccum does not map).
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter, RopeScalingType
from gguf.quants import quantize
from safetensors.torch import save_file

TEXTS = [
    "The film was a delight from start to finish, and the acting was outstanding.",
    "And God said, Let there be light: and there was light.",
    "it's a slow , quiet movie ; the kind that lets you breathe .",
    "Numbers like 1999 and 3.14159 don't tokenize the way words do!",
]
PROMPT = "The film was a delight from start to finish, and the acting"
GREEDY_TOKENS = 8


def load_tokenizer(gguf_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


def save_tokenizer(gguf_path, out_dir):
    tokenizer = load_tokenizer(gguf_path)
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def reference_logits(gguf_path, tokenizer, texts, rope_parameters=None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                 dtype=torch.float32).eval()
    if rope_parameters is not None:
        # transformers' GGUF loader reads no llama.rope.scaling.* keys: the same weights in a model
        # built from the config with the scaling the file's metadata states.
        config = model.config
        config.rope_parameters = dict(rope_parameters)
        scaled = type(model)(config).to(torch.float32).eval()
        scaled.load_state_dict(model.state_dict())
        model = scaled
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = 0
    batch = tokenizer(texts, add_special_tokens=False, padding=True, padding_side="right", return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    tensors = {"input_ids": batch["input_ids"].contiguous(), "attention_mask": batch["attention_mask"].contiguous(),
               "logits": logits.float().contiguous()}
    return model, tensors


def model_reference(gguf_path, out_dir):
    tokenizer = save_tokenizer(gguf_path, out_dir / "tokenizer")
    model, tensors = reference_logits(gguf_path, tokenizer, TEXTS)
    save_file(tensors, str(out_dir / "reference.safetensors"))
    prompt = tokenizer(PROMPT, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=GREEDY_TOKENS,
                             do_sample=False)
    new = out[0, prompt.shape[1]:].tolist()
    greedy = {"prompt": PROMPT, "prompt_ids": prompt[0].tolist(), "ids": new,
              "text": tokenizer.backend_tokenizer.decode(new)}
    (out_dir / "greedy.json").write_text(json.dumps(greedy, ensure_ascii=False), encoding="utf-8")


# --- Synthetic files --------------------------------------------------------------------------

def byte_characters():
    """GPT-2's bytes_to_unicode: byte b -> its printable character."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def tiny_vocabulary():
    """Byte characters (ids 6..261) behind six added tokens, merges learned from a few words, a
    user-defined token and one token written in plain UTF-8 with a space (not byte characters)."""
    spell = byte_characters()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "<think>", "<pad>"]
    types = [3, 3, 3, 4, 4, 3]
    tokens = list(specials) + [spell[b] for b in range(256)]
    types += [1] * 256
    # "1999" is one piece for GPT-2's expression, two for Llama 3's, four for Qwen2's.
    words = ["the", " the", " film", " light", " said", "ing", " and", " God", "'s", " 12", "ab", "1999"]
    merges = []
    for word in words:
        symbols = [spell[b] for b in word.encode("utf-8")]
        while len(symbols) > 1:
            merged = symbols[0] + symbols[1]
            if f"{symbols[0]} {symbols[1]}" not in merges:
                merges.append(f"{symbols[0]} {symbols[1]}")
            if merged not in tokens:
                tokens.append(merged)
                types.append(1)
            symbols = [merged] + symbols[2:]
    tokens.append("a b")  # plain UTF-8 with a space: transformers respells it as byte characters
    types.append(1)
    return tokens, types, merges


def add_tokenizer(w, pre, bos=1, eos=2, pad=5, model="gpt2"):
    tokens, types, merges = tiny_vocabulary()
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_pad_token_id(pad)
    w.add_add_bos_token(False)
    return len(tokens)


TINY = dict(layers=2, width=32, ffn=48, heads=4, kv_heads=2, head_dim=8)


def add_llama_metadata(w, vocab, skip=(), t=TINY):
    values = {
        "context_length": lambda: w.add_context_length(64),
        "embedding_length": lambda: w.add_embedding_length(t["width"]),
        "block_count": lambda: w.add_block_count(t["layers"]),
        "feed_forward_length": lambda: w.add_feed_forward_length(t["ffn"]),
        "head_count": lambda: w.add_head_count(t["heads"]),
        "head_count_kv": lambda: w.add_head_count_kv(t["kv_heads"]),
        "rope_dimension_count": lambda: w.add_rope_dimension_count(t["head_dim"]),
        "rope_freq_base": lambda: w.add_rope_freq_base(5000.0),
        "layer_norm_rms_eps": lambda: w.add_layer_norm_rms_eps(1e-5),
        "vocab_size": lambda: w.add_vocab_size(vocab),
    }
    for name, add in values.items():
        if name not in skip:
            add()


def add_llama_tensors(w, vocab, rng, wrong_shape=None, t=TINY, tied=False):
    q_rows, kv_rows = t["heads"] * t["head_dim"], t["kv_heads"] * t["head_dim"]

    def weight(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def add(name, array, kind=Q.F32):
        if name == wrong_shape:
            array = array[..., :-1].copy()
        if kind == Q.F32:
            w.add_tensor(name, array)
        elif kind == Q.F16:
            w.add_tensor(name, array.astype(np.float16))
        else:
            w.add_tensor(name, quantize(array, kind), raw_dtype=kind)

    add("token_embd.weight", weight(vocab, t["width"], scale=1.0), Q.Q8_0)
    for i in range(t["layers"]):
        add(f"blk.{i}.attn_norm.weight", 1 + weight(t["width"], scale=0.1))
        add(f"blk.{i}.attn_q.weight", weight(q_rows, t["width"]), Q.Q8_0)
        add(f"blk.{i}.attn_k.weight", weight(kv_rows, t["width"]), Q.F16)
        add(f"blk.{i}.attn_v.weight", weight(kv_rows, t["width"]))
        add(f"blk.{i}.attn_output.weight", weight(t["width"], q_rows))
        add(f"blk.{i}.ffn_norm.weight", 1 + weight(t["width"], scale=0.1))
        add(f"blk.{i}.ffn_gate.weight", weight(t["ffn"], t["width"]), Q.Q8_0)
        add(f"blk.{i}.ffn_up.weight", weight(t["ffn"], t["width"]))
        add(f"blk.{i}.ffn_down.weight", weight(t["width"], t["ffn"]))
    add("output_norm.weight", 1 + weight(t["width"], scale=0.1))
    if not tied:
        add("output.weight", weight(vocab, t["width"]))


def write(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_llama(path, architecture="llama", skip=(), wrong_shape=None, pre="smollm", t=TINY, tied=False,
               more_metadata=lambda w: None):
    rng = np.random.default_rng(53)
    w = GGUFWriter(str(path), architecture)
    w.add_name("tiny llama")
    vocab = add_tokenizer(w, pre)
    add_llama_metadata(w, vocab, skip, t)
    more_metadata(w)
    add_llama_tensors(w, vocab, rng, wrong_shape, t, tied)
    write(w)


def explicit_head_size(w):
    w.add_key_length(12)
    w.add_value_length(12)


def linear_rope_scaling(w):
    w.add_rope_scaling_type(RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(4.0)


# YaRN as llama.cpp's converter writes it; the rope_parameters transformers builds the same from.
YARN = dict(rope_type="yarn", rope_theta=5000.0, factor=4.0, original_max_position_embeddings=16, beta_fast=16.0,
            beta_slow=2.0)


def yarn_rope_scaling(w):
    w.add_rope_scaling_type(RopeScalingType.YARN)
    w.add_rope_scaling_factor(YARN["factor"])
    w.add_rope_scaling_orig_ctx_len(YARN["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_beta_fast(YARN["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(YARN["beta_slow"])


def yarn_log_multiplier(w):
    yarn_rope_scaling(w)
    w.add_rope_scaling_yarn_log_mul(0.1)


def tokenizer_only(path, pre, model="gpt2"):
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny tokenizer")
    vocab = add_tokenizer(w, pre, model=model)
    add_llama_metadata(w, vocab)
    write(w)


def synthetic_tokenizers(out_dir):
    for case, pre in [("tok-smollm", "smollm"), ("tok-llama-bpe", "llama-bpe"), ("tok-qwen2", "qwen2")]:
        tokenizer_only(out_dir / f"{case}.gguf", pre)
        save_tokenizer(out_dir / f"{case}.gguf", out_dir / case)
    tokenizer_only(out_dir / "bad-pre-tokenizer.gguf", "no-such-pre")
    tokenizer_only(out_dir / "bad-model.gguf", "smollm", model="llama")


def synthetic_models(out_dir):
    path = out_dir / "tiny-llama.gguf"
    tiny_llama(path)
    tokenizer = load_tokenizer(path)
    _, tensors = reference_logits(path, tokenizer, ["the film and the light", "God said ab <think>", "the"])
    save_file(tensors, str(out_dir / "tiny-llama.safetensors"))
    path = out_dir / "tiny-llama-head-dim.gguf"
    tiny_llama(path, t=dict(TINY, head_dim=12), tied=True, more_metadata=explicit_head_size)
    _, tensors = reference_logits(path, tokenizer, ["the film and the light", "God said ab <think>", "the"])
    save_file(tensors, str(out_dir / "tiny-llama-head-dim.safetensors"))
    tiny_llama(out_dir / "tiny-llama-rope-linear.gguf", skip=("vocab_size",), more_metadata=linear_rope_scaling)
    path = out_dir / "tiny-llama-rope-yarn.gguf"
    tiny_llama(path, more_metadata=yarn_rope_scaling)
    _, tensors = reference_logits(path, tokenizer, ["the film and the light", "God said ab <think>", "the"], YARN)
    save_file(tensors, str(out_dir / "tiny-llama-rope-yarn.safetensors"))
    tiny_llama(out_dir / "bad-rope-yarn-log-multiplier.gguf", more_metadata=yarn_log_multiplier)
    tiny_llama(out_dir / "bad-architecture.gguf", architecture="gpt2")
    tiny_llama(out_dir / "bad-missing-key.gguf", skip=("embedding_length",))
    tiny_llama(out_dir / "bad-shape.gguf", wrong_shape="blk.1.attn_k.weight")


def main():
    mode = sys.argv[1]
    if mode == "model":
        model_reference(Path(sys.argv[2]), Path(sys.argv[3]))
    elif mode == "tokenizer":
        save_tokenizer(Path(sys.argv[2]), Path(sys.argv[3]) / "tokenizer")
    elif mode == "tokenizers":
        synthetic_tokenizers(Path(sys.argv[2]))
    elif mode == "models":
        synthetic_models(Path(sys.argv[2]))
    else:
        sys.exit(f"gguf_transformers_reference.py: unknown mode {mode!r}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
