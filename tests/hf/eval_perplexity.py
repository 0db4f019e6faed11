#!/opt/gradaccum/venv/bin/python
"""The reference of `gradaccum eval` (tests/models/hf_interop_test.cpp): transformers' loss and perplexity of a
text under checkpoints that gradaccum wrote.

  /opt/gradaccum/venv/bin/python tests/hf/eval_perplexity.py DIR

For each directory listed in DIR/checkpoints.json (a gradaccum run's final/: config.json,
model.safetensors, gpt2.tiktoken), loads the model with AutoModelForCausalLM.from_pretrained in float32
and DIR/eval.txt as `gradaccum eval` reads it: one document per line (split on b"\\n", blank lines
skipped), encoded with tiktoken's GPT-2 encoding from the checkpoint's gpt2.tiktoken
(encode_ordinary), cut to the model's n_positions (GPT-2; BLOOM has no limit), documents of fewer
than 2 tokens dropped. Each document runs alone (no padding) with labels = its ids; transformers'
mean loss times its n - 1 targets gives its sum. Writes DIR/perplexity.json:
{checkpoint: {"loss": Σ sums / Σ targets, "perplexity": exp(loss), "tokens": Σ targets}}.
"""
import json
import math
import os
import sys

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "tokenizer"))
from gpt2_reference import gpt2_encoding  # noqa: E402  tiktoken's GPT-2 encoding, offline


def evaluate(checkpoint, lines):
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    encoding = gpt2_encoding(os.path.join(checkpoint, "gpt2.tiktoken"))
    limit = getattr(model.config, "n_positions", None)
    total, targets = 0.0, 0
    with torch.no_grad():
        for line in lines:
            ids = encoding.encode_ordinary(line)[:limit]
            if len(ids) < 2:
                continue
            input_ids = torch.tensor([ids])
            loss = model(input_ids=input_ids, labels=input_ids).loss
            total += loss.double().item() * (len(ids) - 1)
            targets += len(ids) - 1
    return {"loss": total / targets, "perplexity": math.exp(total / targets), "tokens": targets,
            "model_class": type(model).__name__}


def main():
    out = sys.argv[1]
    with open(os.path.join(out, "eval.txt"), "rb") as f:
        lines = [raw.decode("utf-8", errors="replace") for raw in f.read().split(b"\n")]
    lines = [line for line in lines if line.strip()]
    with open(os.path.join(out, "checkpoints.json")) as f:
        checkpoints = json.load(f)
    results = {c: evaluate(c, lines) for c in checkpoints}
    with open(os.path.join(out, "perplexity.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
