#!/usr/bin/env python3
# Writes the hand-made seed inputs of fuzz/corpus/ (run from the repository root:
# /opt/gradaccum/venv/bin/python fuzz/gen_seeds.py). Seeds only give the fuzzer a start; a
# crashing input found later is added next to them by hand as a regression.
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    os.makedirs(os.path.join(ROOT, target), exist_ok=True)
    with open(os.path.join(ROOT, target, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def safetensors(header, data=b""):
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data


# safetensors: one file per dtype, metadata, an empty tensor, a scalar, two tensors.
dtypes = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
for dtype, size in dtypes.items():
    n = 6 * size
    put("safetensors", f"{dtype.lower()}", safetensors(
        {"w": {"dtype": dtype, "shape": [2, 3], "data_offsets": [0, n]}},
        bytes((i * 37) & (1 if dtype == "BOOL" else 0xFF) for i in range(n))))
put("safetensors", "metadata", safetensors(
    {"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
    struct.pack("<f", 1.5)))
put("safetensors", "empty_and_scalar", safetensors(
    {"e": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]},
     "s": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]}}, struct.pack("<q", -7)))
put("safetensors", "two_tensors_gap", safetensors(
    {"x": {"dtype": "F16", "shape": [2], "data_offsets": [8, 12]},
     "y": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]}}, bytes(range(16))))
put("safetensors", "empty_header", safetensors({}))

# config: a YAML file, then after a NUL byte one --set override per line.
put("config", "empty", "")
put("config", "image", "model:\n  type: mlp\n  hidden: [64, 32]\nper_device_train_batch_size: 8\n"
    "gradient_accumulation_steps: 2\nlearning_rate: 1.0e-3\nlr_scheduler_type: linear\n")
put("config", "lm", "model:\n  type: gpt2\n  n_layer: 2\ndata:\n  type: text\n  path: a.txt\n"
    "  packing: true\nsample:\n  prompt: \"In the beginning\"\nglobal_batch_size: 32\n")
put("config", "overrides", "seed: 1\n\0model.type=bloom\ndata.type=kjv\ntrainer.save_steps=3\n"
    "save_total_limit=2\nresume_from_checkpoint=\nwarmup_ratio=0.1\n")
put("config", "bad_type", "per_device_train_batch_size: [1, 2]\nnum_train_epochs: -1\n")
for name in ("kjv-gpt2.yaml", "kjv-gpt2-classify.yaml"):
    path = os.path.join(os.path.dirname(ROOT), "..", "configs", name)
    with open(path, "rb") as f:
        put("config", name.replace(".yaml", ""), f.read())

# tokenizer: text, including invalid UTF-8 and the special token.
put("tokenizer", "ascii", "Hello world! It's 2024, isn't it?  \n\tYes.")
put("tokenizer", "unicode", "héllo wörld — 日本語 🤗 \u0085\ufeff\u00a0x")
put("tokenizer", "invalid_utf8", b"ok \xff\xfe \xc3 \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 end")
put("tokenizer", "special", "a<|endoftext|>b   's 've 're 'll 'd 't 123 4567")

# tokenizer_json: small Hugging Face tokenizer.json files of the supported shapes.
byte_vocab = {c: i for i, c in enumerate(["H", "e", "l", "o", "Ġ", "w", "r", "d", "lo", "He"])}
def hf(pre, merges, added=(), normalizer=None):
    return json.dumps({"version": "1.0", "added_tokens": list(added), "normalizer": normalizer,
                       "pre_tokenizer": pre, "model": {"type": "BPE", "vocab": byte_vocab, "merges": merges}})
bytelevel = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
put("tokenizer_json", "bytelevel", hf(bytelevel, ["l o", "H e"]))
put("tokenizer_json", "sequence_pairs", hf({"type": "Sequence", "pretokenizers": [bytelevel]}, [["l", "o"]],
    [{"id": 10, "content": "<|endoftext|>", "special": True, "single_word": False, "lstrip": False,
      "rstrip": False, "normalized": False}]))
put("tokenizer_json", "bloom", hf({"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": " ?[^(\\s|[.,!?…。，、।۔،])]+"}, "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}, ["H e"]))
llama3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
          "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
put("tokenizer_json", "llama3_split_digits", hf({"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True},
    {"type": "Split", "pattern": {"Regex": llama3}, "behavior": "MergedWithPrevious", "invert": True},
    {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]}, ["l o"],
    [{"id": 10, "content": "<|eot_id|>", "special": True, "single_word": True, "lstrip": True,
      "rstrip": True, "normalized": True}]))
# Qwen2's normalizer, and a Sequence of forms with a normalized added token written decomposed.
put("tokenizer_json", "normalizer_nfc", hf(bytelevel, ["l o"], normalizer={"type": "NFC"}))
put("tokenizer_json", "normalizer_sequence", hf(bytelevel, ["H e"],
    [{"id": 10, "content": "he\u0301", "special": False, "single_word": False, "lstrip": False,
      "rstrip": False, "normalized": True}],
    normalizer={"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "NFKC"}]}))
