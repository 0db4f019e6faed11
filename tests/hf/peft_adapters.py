#!/opt/gradaccum/venv/bin/python
"""Reference LoRA adapters for tests/models/lora_test.cpp, made and read by Hugging Face PEFT itself.

  /opt/gradaccum/venv/bin/python tests/hf/peft_adapters.py OUT make
    For each case of CASES: a random-init transformers model (every weight redrawn, as
    save_pretrained_models.py does) saved with save_pretrained into OUT/<case>/base; PEFT's LoRA
    on it (get_peft_model with the case's LoraConfig), its A and B redrawn (B nonzero: a fresh B is
    zero and would hide a wrong or transposed adapter), saved with PEFT's save_pretrained into
    OUT/<case>/peft; and OUT/<case>/reference.safetensors with a padded batch (input_ids,
    attention_mask: row 0 unpadded, row 1 right-padded, row 2 left-padded) and the PEFT model's
    logits on it with its weights in float64 (logits64; transformers' float32 casts run in
    float64, see save_pretrained_models.run) and in float32 (logits32). OUT/cases.json lists the
    cases with their LoRA settings.
  /opt/gradaccum/venv/bin/python tests/hf/peft_adapters.py OUT check
    For each case: the adapter gradaccum wrote into OUT/<case>/ours (adapter_config.json +
    adapter_model.safetensors, with B nonzero), loaded by PeftModel.from_pretrained onto
    OUT/<case>/base in float64. OUT/results.json: per case the keys PEFT expects but the file
    lacks (missing), the file's keys PEFT does not know (unexpected), and the largest relative
    difference of PEFT's float64 logits from gradaccum's (OUT/<case>/ours/reference.safetensors).
"""
import copy
import json
import os
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from save_pretrained_models import batch, build, run  # noqa: E402

# name, architecture, labels, model config, LoRA settings (odd ranks; different targets; an untied
# head trained whole; a classifier's score; rsLoRA; GPT-2's Conv1D).
CASES = [
    ("llama-lm", "llama", 0,
     dict(vocab_size=48, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False),
     dict(r=3, lora_alpha=7.0, target_modules=["q_proj", "v_proj", "down_proj"], modules_to_save=["lm_head"])),
    ("qwen2-cls", "qwen2", 3,
     dict(vocab_size=40, hidden_size=24, intermediate_size=32, num_hidden_layers=2, num_attention_heads=6,
          num_key_value_heads=2, max_position_embeddings=32, pad_token_id=0),
     dict(r=5, lora_alpha=16.0, use_rslora=True,
          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
          modules_to_save=["score"])),
    ("gpt2-lm", "gpt2", 0, dict(vocab_size=50, n_positions=16, n_embd=24, n_layer=2, n_head=3),
     dict(r=1, lora_alpha=2.0, target_modules=["c_attn", "mlp.c_proj"])),
    ("bloom-lm", "bloom", 0, dict(vocab_size=45, hidden_size=24, n_layer=2, n_head=4),
     dict(r=3, lora_alpha=4.0, lora_dropout=0.1, target_modules=["query_key_value", "dense_4h_to_h"])),
]


def vocab_and_pad(kwargs):
    return kwargs["vocab_size"], kwargs.get("pad_token_id", 0)


def make(out):
    torch.manual_seed(0)
    listed = []
    for name, arch, labels, kwargs, lora in CASES:
        case = os.path.join(out, name)
        model = build(arch, labels, kwargs)
        model.save_pretrained(os.path.join(case, "base"))
        task = "SEQ_CLS" if labels else "CAUSAL_LM"
        peft_model = get_peft_model(model, LoraConfig(task_type=task, **copy.deepcopy(lora)))  # PEFT extends its lists
        with torch.no_grad():
            for key, p in peft_model.named_parameters():
                if "lora_" in key or "modules_to_save" in key:
                    p.copy_(0.3 * torch.randn_like(p))
        peft_model.save_pretrained(os.path.join(case, "peft"))
        ids, mask, positions = batch(*vocab_and_pad(kwargs))
        tensors = {"input_ids": ids, "attention_mask": mask}
        peft_model.eval()
        for dtype, key in ((torch.float64, "logits64"), (torch.float32, "logits32")):
            peft_model.to(dtype)
            tensors[key] = run(peft_model, arch, ids, mask, positions).logits.detach().contiguous()
        save_file(tensors, os.path.join(case, "reference.safetensors"))
        listed.append(dict(name=name, architecture=arch, labels=labels, lora=lora))
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(listed, f, indent=2)


def check(out):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    results = {}
    for name, arch, labels, kwargs, lora in CASES:
        case = os.path.join(out, name)
        ours = os.path.join(case, "ours")
        cls = AutoModelForSequenceClassification if labels else AutoModelForCausalLM
        base = cls.from_pretrained(os.path.join(case, "base"), dtype=torch.float64, attn_implementation="eager")
        peft_model = PeftModel.from_pretrained(base, ours).eval()
        expected = set(get_peft_model_state_dict(peft_model).keys())
        saved = set(load_file(os.path.join(ours, "adapter_model.safetensors")).keys())
        reference = load_file(os.path.join(ours, "reference.safetensors"))
        ids, mask = reference["input_ids"], reference["attention_mask"]
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        logits = run(peft_model, arch, ids, mask, positions).logits
        ours_logits = reference["logits64"]
        real = mask.bool() if not labels else torch.ones(ids.shape[0], dtype=torch.bool)
        difference = ((logits[real] - ours_logits[real]).abs().max() / ours_logits[real].abs().max()).item()
        results[name] = dict(missing=sorted(expected - saved), unexpected=sorted(saved - expected),
                             max_relative_difference=difference, max_abs_logit=ours_logits[real].abs().max().item(),
                             peft_class=type(peft_model).__name__)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    {"make": make, "check": check}[sys.argv[2]](sys.argv[1])
