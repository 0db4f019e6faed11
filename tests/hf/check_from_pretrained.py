#!/opt/gradaccum/venv/bin/python
"""transformers' side of tests/models/hf_interop_test.cpp's second direction: checkpoints written by
gradaccum (models/hf_checkpoint.h, what a run's final/ holds) loaded with
AutoModelForCausalLM / AutoModelForSequenceClassification.from_pretrained.

DIR/cases.json lists the cases (name, labels); each DIR/<name>/ holds the checkpoint and
reference.safetensors (input_ids, attention_mask, position_ids, labels, and gradaccum's logits64
computed in float64 from the saved weights). Writes DIR/results.json: per case the loading info
(missing, unexpected and mismatched keys), the largest difference of transformers' float64 logits
from gradaccum's over the real tokens (classifier: all rows), relative to the largest |logit|, and
transformers' loss with those labels (the mean over the scored tokens, or over the rows).

  /opt/gradaccum/venv/bin/python tests/hf/check_from_pretrained.py DIR
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from save_pretrained_models import run  # noqa: E402  (float64 BLOOM softmax, see there)


def main():
    root = sys.argv[1]
    with open(os.path.join(root, "cases.json")) as f:
        cases = json.load(f)
    results = {}
    for case in cases:
        path = os.path.join(root, case["name"])
        auto = AutoModelForSequenceClassification if case["labels"] else AutoModelForCausalLM
        model, info = auto.from_pretrained(path, output_loading_info=True, attn_implementation="eager")
        model = model.eval().double()
        ref = load_file(os.path.join(path, "reference.safetensors"))
        ours = ref["logits64"]
        out = run(model, model.config.model_type, ref["input_ids"], ref["attention_mask"],
                  ref["position_ids"], labels=ref["labels"])
        theirs = out.logits
        real = ref["attention_mask"].bool() if not case["labels"] else torch.ones(ours.shape[0], dtype=torch.bool)
        diff = ((theirs[real] - ours[real]).abs().max() / ours[real].abs().max()).item()
        results[case["name"]] = {
            "missing": list(info.get("missing_keys", [])),
            "unexpected": list(info.get("unexpected_keys", [])),
            "mismatched": [str(m) for m in info.get("mismatched_keys", [])],
            "model_class": type(model).__name__,
            "max_relative_difference": diff,
            "max_abs_logit": ours[real].abs().max().item(),
            "loss": out.loss.item(),
        }
    with open(os.path.join(root, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
