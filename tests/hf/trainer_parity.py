#!/opt/gradaccum/venv/bin/python
"""The reference trajectories of tests/hf_trainer_parity_test.cpp: Hugging Face's Trainer and an
HF Accelerate accumulate() loop, on the data and initial weights that gradaccum then trains on.

  /opt/gradaccum/venv/bin/python tests/hf/trainer_parity.py OUT GPT2_TIKTOKEN

writes
  OUT/train.jsonl          160 documents {"text": ...} of 2 to ~70 GPT-2 tokens (the longest are
                           cut at MAX_LENGTH tokens): the data file both trainers read, in order
  OUT/model/               a random-init GPT2LMHeadModel, as transformers' save_pretrained writes it
  OUT/trainer-<dtype>.json the Trainer's per-optimizer-step {loss, grad_norm, lr}
  OUT/accelerate-<dtype>.json  the same from Accelerate's accumulate() loop
for dtype float64 and float32, and OUT/trainer-stock.json (below).

Both runs: micro-batch 4 x 4 accumulation, 10 optimizer steps, samples in file order (the
Trainer's train_sampling_strategy "sequential", gradaccum's the same), each micro-batch
right-padded to its longest row with <|endoftext|> (50256), labels -100 on the padding, AdamW
(torch's; weight decay 0.1 on all but biases and LayerNorm weights, the Trainer's split), cosine schedule with 2 warm-up steps, clipping at global norm 1.0. Documents are
tokenized with tiktoken's GPT-2 encoding read offline from GPT2_TIKTOKEN (the file gradaccum reads),
encode_ordinary, first MAX_LENGTH tokens.

The Trainer (transformers >= 4.46) normalizes each window by its token count: every micro-batch's
loss is its token sum divided by the window's count of labels[..., 1:] != -100 (num_items_in_batch),
which is gradaccum's `loss_normalization: window`. Its float32 run is the stock Trainer. For
float64, transformers' causal-LM loss casts the logits to float32 (ForCausalLMLoss's upcast meant
for 16-bit models); the float64 run passes the same formula without that cast as compute_loss_func,
so the reference is float64-accurate.

transformers 5.24's Trainer counts the targets as labels[..., 1:] only for a model whose `loss_type`
maps to ForCausalLMLoss, and a model's loss_type comes from its class name: GPT2LMHeadModel gets
None (its forward still uses ForCausalLMLoss), so the stock Trainer divides each GPT-2 window by its
tokens plus one per row: every loss and gradient is scaled by tokens / (tokens + rows). The runs set
model.loss_type = "ForCausalLM", which changes that count and nothing else; OUT/trainer-stock.json
holds the first step of the stock Trainer in float64 (logits cast to float32, as shipped), for the
test to measure that factor. The per-step loss is the sum of training_step's returns over
the window (each already divided by the window's count); grad_norm is the pre-clip global norm
_clip_grad_norm returns; lr is the rate the step used.

The Accelerate loop is the one its documentation and seed 004 teach: each micro-batch's mean loss,
divided by the accumulation steps by accelerator.backward; its loss is the sum of those terms.
That is gradaccum's `loss_normalization: micro_batch`.
"""
import json
import math
import os
import random
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "tokenizer"))
from gpt2_reference import gpt2_encoding  # noqa: E402  tiktoken's GPT-2 encoding, offline

MICRO_BATCH = 4
ACCUMULATION = 4
STEPS = 10
MAX_LENGTH = 48
PAD = 50256
LR = 3e-3
WEIGHT_DECAY = 0.1
WARMUP = 2
MAX_GRAD_NORM = 1.0
SEED = 5

WORDS = ("in the beginning God created heaven and earth ; was without form void darkness upon face of "
         "deep Spirit moved waters said Let there be light : saw that it good divided from called Day "
         "Night evening morning first day firmament midst them under above second gathered together "
         "unto one place dry land appear so Seas grass herb yielding seed fruit tree after his kind").split()


def documents():
    rng = random.Random(SEED)
    docs = []
    for i in range(MICRO_BATCH * ACCUMULATION * STEPS):
        # Mostly short, some past MAX_LENGTH tokens: every micro-batch pads, some rows are cut.
        n = rng.choice([1, 2, 3, 5, 8, 13, 21, 34, 55]) + rng.randrange(3)
        words = [rng.choice(WORDS) for _ in range(n)]
        docs.append(" ".join(words).capitalize() + ".")
    return docs


class Rows(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i]}


def collate(features):
    """Right-pads to the longest row; labels = ids with -100 on the padding (unshifted)."""
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), longest), PAD, dtype=torch.long)
    mask = torch.zeros((len(features), longest), dtype=torch.long)
    for r, f in enumerate(features):
        ids[r, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[r, :len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def causal_lm_loss(outputs, labels, num_items_in_batch=None):
    """transformers' ForCausalLMLoss in the logits' own dtype: shifted targets, -100 ignored, the sum
    divided by num_items_in_batch (or the mean when it is None)."""
    logits = outputs.logits if hasattr(outputs, "logits") else outputs
    targets = F.pad(labels, (0, 1), value=-100)[..., 1:]
    flat = logits.reshape(-1, logits.size(-1))
    if num_items_in_batch is None:
        return F.cross_entropy(flat, targets.reshape(-1), ignore_index=-100)
    return F.cross_entropy(flat, targets.reshape(-1), ignore_index=-100, reduction="sum") / num_items_in_batch


def load(out, dtype):
    from transformers import GPT2LMHeadModel
    model = GPT2LMHeadModel.from_pretrained(os.path.join(out, "model"), attn_implementation="eager")
    return model.to(dtype)


def training_arguments(output_dir, max_steps):
    """The Trainer's settings for these runs (the module's constants)."""
    from transformers import TrainingArguments
    return TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=ACCUMULATION, max_steps=max_steps, learning_rate=LR,
        weight_decay=WEIGHT_DECAY,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, optim="adamw_torch", lr_scheduler_type="cosine",
        warmup_steps=WARMUP, max_grad_norm=MAX_GRAD_NORM, train_sampling_strategy="sequential",
        use_cpu=True, logging_steps=1, save_strategy="no", report_to=[], seed=SEED,
        dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True)


def recorded_training(model, args, rows, compute_loss_func=None):
    """Trains `model` with the Trainer; its per-optimizer-step {loss, grad_norm, lr}: the loss is the
    sum of training_step's returns over the window, grad_norm the pre-clip norm."""
    from transformers import Trainer

    steps = []

    class RecordingTrainer(Trainer):
        window_loss = 0.0

        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            self.window_loss += loss.item()
            return loss

        def _clip_grad_norm(self, model):
            norm = super()._clip_grad_norm(model)
            steps.append({"loss": self.window_loss, "grad_norm": float(norm),
                          "lr": self.optimizer.param_groups[0]["lr"]})
            self.window_loss = 0.0
            return norm

    trainer = RecordingTrainer(model=model, args=args, train_dataset=Rows(rows), data_collator=collate,
                               compute_loss_func=compute_loss_func)
    trainer.train()
    return steps


def run_trainer(out, rows, dtype, name, stock=False):
    """The Trainer's per-step records; `stock`: one step with GPT2LMHeadModel exactly as loaded."""
    args = training_arguments(os.path.join(out, "trainer-run-" + name), 1 if stock else STEPS)
    model = load(out, dtype)
    if not stock:
        # See the module's docstring: without it this Trainer counts labels[..., :] for GPT-2.
        model.loss_type = "ForCausalLM"
    steps = recorded_training(model, args, rows,
                              compute_loss_func=causal_lm_loss if dtype == torch.float64 and not stock else None)
    assert len(steps) == (1 if stock else STEPS), steps
    return steps


def run_accelerate(out, rows, dtype):
    from accelerate import Accelerator
    from transformers import get_cosine_schedule_with_warmup
    from transformers.trainer_pt_utils import get_parameter_names

    accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATION, cpu=True)
    model = load(out, dtype)
    # Weight decay as HF's no_trainer examples group it: not on biases and LayerNorm weights.
    decayed = set(get_parameter_names(model, [torch.nn.LayerNorm], ["bias", "layernorm", "rmsnorm"]))
    groups = [{"params": [p for n, p in model.named_parameters() if n in decayed], "weight_decay": WEIGHT_DECAY},
              {"params": [p for n, p in model.named_parameters() if n not in decayed], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8)
    schedule = get_cosine_schedule_with_warmup(optimizer, WARMUP, STEPS)
    loader = torch.utils.data.DataLoader(Rows(rows), batch_size=MICRO_BATCH, shuffle=False, collate_fn=collate)
    model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, loader, schedule)
    model.train()
    steps, window_loss = [], 0.0
    for batch in loader:
        with accelerator.accumulate(model):
            labels = batch.pop("labels")
            loss = causal_lm_loss(model(**batch), labels)
            accelerator.backward(loss)
            window_loss += loss.item() / ACCUMULATION
            if accelerator.sync_gradients:
                lr = optimizer.param_groups[0]["lr"]
                norm = accelerator.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
                steps.append({"loss": window_loss, "grad_norm": float(norm), "lr": lr})
                window_loss = 0.0
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
    assert len(steps) == STEPS, steps
    return steps


def main():
    out, tiktoken_path = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    docs = documents()
    with open(os.path.join(out, "train.jsonl"), "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    encoding = gpt2_encoding(tiktoken_path)
    rows = [encoding.encode_ordinary(d)[:MAX_LENGTH] for d in docs]
    assert min(len(r) for r in rows) >= 2 and max(len(r) for r in rows) == MAX_LENGTH

    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(SEED)
    config = GPT2Config(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    GPT2LMHeadModel(config).save_pretrained(os.path.join(out, "model"))

    for dtype, name in ((torch.float64, "float64"), (torch.float32, "float32")):
        torch.manual_seed(SEED)
        for peer, steps in (("trainer", run_trainer(out, rows, dtype, name)), ("accelerate", run_accelerate(out, rows, dtype))):
            assert all(math.isfinite(s["loss"]) and math.isfinite(s["grad_norm"]) for s in steps)
            with open(os.path.join(out, f"{peer}-{name}.json"), "w") as f:
                json.dump(steps, f, indent=1)
    with open(os.path.join(out, "trainer-stock.json"), "w") as f:
        json.dump(run_trainer(out, rows, torch.float64, "stock", stock=True), f, indent=1)


if __name__ == "__main__":
    main()
