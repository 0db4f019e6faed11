#!/opt/gradaccum/venv/bin/python
"""The reference trajectory of HfTrainerPeftParity (tests/models/hf_interop_test.cpp): Hugging Face's
Trainer on a PEFT LoRA model, from adapter weights that gradaccum then starts from
(lora.init_from), on trainer_parity.py's data and settings.

  /opt/gradaccum/venv/bin/python tests/hf/peft_trainer_parity.py OUT GPT2_TIKTOKEN

writes
  OUT/train.jsonl         trainer_parity.py's 160 documents, in order
  OUT/model/              a random-init LlamaForCausalLM (grouped-query attention, untied head,
                          vocab 50257 for GPT-2's ids), float64, as save_pretrained writes it
  OUT/adapter-init/       PEFT's adapter before training (save_pretrained): r 4, alpha 8 on
                          q_proj, v_proj, down_proj, both A and B random (init_lora_weights=False),
                          so that a run which ignored these weights would not follow
  OUT/trainer-float64.json  the Trainer's per-optimizer-step {loss, grad_norm, lr}
  OUT/adapter-final/      the adapter after the 10 steps

The Trainer: micro-batch 4 x 4 accumulation, 10 steps, float64 with trainer_parity.py's float64
loss (its compute_loss_func: transformers' ForCausalLMLoss without the float32 cast) and the Llama
family's RMSNorm, RoPE and softmax in float64 (save_pretrained_models.py's
llama_family_in_float64; transformers runs them in float32 whatever the dtype), AdamW with
weight decay on the adapters (the Trainer's split decays every weight that is not a bias or a
norm), cosine with 2 warm-up steps, clipping 1.0. Only the adapters train.
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_parity as tp  # noqa: E402  the data, the collator, the loss and the constants
from save_pretrained_models import llama_family_in_float64  # noqa: E402  RMSNorm, RoPE, softmax in float64

R, ALPHA, TARGETS = 4, 8.0, ["q_proj", "v_proj", "down_proj"]


def run_trainer(out, model, rows):
    args = tp.training_arguments(os.path.join(out, "trainer-run"), tp.STEPS)
    with llama_family_in_float64(model):
        steps = tp.recorded_training(model, args, rows, compute_loss_func=tp.causal_lm_loss)
    assert len(steps) == tp.STEPS, steps
    return steps


def main():
    out, tiktoken_path = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    docs = tp.documents()
    with open(os.path.join(out, "train.jsonl"), "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    encoding = tp.gpt2_encoding(tiktoken_path)
    rows = [encoding.encode_ordinary(d)[:tp.MAX_LENGTH] for d in docs]

    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(tp.SEED)
    config = LlamaConfig(vocab_size=50257, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, rms_norm_eps=1e-6, pad_token_id=tp.PAD,
                         bos_token_id=tp.PAD, eos_token_id=tp.PAD)
    LlamaForCausalLM(config).save_pretrained(os.path.join(out, "model"))
    base = LlamaForCausalLM.from_pretrained(os.path.join(out, "model"), attn_implementation="eager")
    base = base.to(torch.float64)
    torch.manual_seed(tp.SEED + 1)
    model = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", r=R, lora_alpha=ALPHA, lora_dropout=0.0,
                                            target_modules=TARGETS, init_lora_weights=False))
    model.save_pretrained(os.path.join(out, "adapter-init"))
    steps = run_trainer(out, model, rows)
    assert all(math.isfinite(s["loss"]) and math.isfinite(s["grad_norm"]) for s in steps)
    with open(os.path.join(out, "trainer-float64.json"), "w") as f:
        json.dump(steps, f, indent=1)
    model.save_pretrained(os.path.join(out, "adapter-final"))


if __name__ == "__main__":
    main()
