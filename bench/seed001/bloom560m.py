#!/opt/gradaccum/venv/bin/python
"""Seed 001 at its real size: a BLOOM-560m-shaped sequence classifier, batch 1 x 16 accumulation,
gradaccum against HF's BloomForSequenceClassification under Lightning Fabric (the seed's stack).

  bloom560m.py prepare DIR                      # the model (save_pretrained) and the data, once
  bloom560m.py fabric DIR --precision fp32|bf16 [--steps 3] [--threads 2]   # one Fabric process
  bloom560m.py compare DIR [--build build] [--steps 3] [--precisions fp32,bf16] [--threads 2]

prepare: a random-init BloomForSequenceClassification of BLOOM-560m's shape (24 layers, hidden 1024,
16 heads, vocab 250880; 559M parameters, 2 labels) written by save_pretrained to DIR/model (float32),
and DIR/train.jsonl: KJV passages of 256 to 512 GPT-2 tokens (consecutive verses joined, as long as
IMDB reviews), labelled Old (0) or New (1) Testament, the two kinds alternating. No BLOOM weights or
tokenizer can be had here: both programs tokenize with GPT-2's BPE (gpt2.tiktoken, ids < 50257 fit
the 250880-row embedding) and start from the same random weights, so accuracy cannot be compared;
this measures time and memory only.

Both programs: the same passages in file order, micro-batch 1 x 16 accumulation steps, Adam (AdamW
with weight decay 0) at lr 5e-5, constant schedule, no clipping (as the seed), `--steps` optimizer
steps; seconds per optimizer step = the median over the steps after the first; peak RSS of the
process. gradaccum: `gradaccum train` with model.hf_checkpoint=DIR/model, mixed_precision no|bf16
(its metrics.jsonl gives step_time_s and peak_rss_mb). Fabric: Fabric(accelerator="cpu", devices=1,
precision "32-true" | "bf16-mixed"), fabric.setup, `with fabric.no_backward_sync(model, enabled=not
last)`, fabric.backward(loss / 16), optimizer step and zero_grad per window.

compare runs, per precision, a gradaccum process then a Fabric process (one at a time: each holds
~10 GB) and prints a Markdown table.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "fixtures", "tokenizer"))
sys.path.insert(0, HERE)
import step_bench  # noqa: E402  (bench/seed001/step_bench.py)

ACCUMULATION = 16
LR = 5e-5
MAX_LENGTH = 512
PASSAGES = 160  # 10 windows


def tokenizer_dir():
    return os.environ.get("GRADACCUM_TOKENIZER_DIR") or "/var/lib/gradaccum/gpt2"


def encoding():
    from gpt2_reference import gpt2_encoding
    return gpt2_encoding(os.path.join(tokenizer_dir(), "gpt2.tiktoken"))


def prepare(out):
    import random

    import torch
    from transformers import BloomConfig, BloomForSequenceClassification

    os.makedirs(out, exist_ok=True)
    listing = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                             text=True).stdout.splitlines()
    verses = [line.split(" ", 1)[1] for line in listing if " " in line]
    assert len(verses) == 31102, len(verses)
    enc = encoding()
    rng = random.Random(1)
    by_testament = {0: [], 1: []}
    for testament, (begin, end) in ((0, (0, 23145)), (1, (23145, 31102))):
        i = begin
        while i < end and len(by_testament[testament]) < PASSAGES // 2:
            target, words, tokens = rng.randint(256, 512), [], 0
            while i < end and tokens < target:
                words.append(verses[i])
                tokens += len(enc.encode_ordinary(" " + verses[i]))
                i += 1
            by_testament[testament].append(" ".join(words))
    with open(os.path.join(out, "train.jsonl"), "w") as f:
        for k in range(PASSAGES // 2):
            for label in (0, 1):
                f.write(json.dumps({"text": by_testament[label][k], "label": label}) + "\n")

    torch.manual_seed(0)
    config = BloomConfig(vocab_size=250880, hidden_size=1024, n_layer=24, n_head=16, num_labels=2,
                         hidden_dropout=0.0, attention_dropout=0.0, pad_token_id=3)
    model = BloomForSequenceClassification(config)
    model.save_pretrained(os.path.join(out, "model"))
    print(json.dumps({"parameters": sum(p.numel() for p in model.parameters()), "passages": PASSAGES}))


def fabric_run(out, precision, steps, threads):
    import lightning
    import torch
    from transformers import BloomForSequenceClassification

    torch.set_num_threads(threads)
    enc = encoding()
    with open(os.path.join(out, "train.jsonl")) as f:
        records = [json.loads(line) for line in f]
    samples = [{"input_ids": torch.tensor([enc.encode_ordinary(r["text"])[:MAX_LENGTH]]),
                "labels": torch.tensor([r["label"]])} for r in records[:steps * ACCUMULATION]]
    fabric = lightning.Fabric(accelerator="cpu", devices=1, precision="bf16-mixed" if precision == "bf16" else "32-true")
    model = BloomForSequenceClassification.from_pretrained(os.path.join(out, "model"), dtype=torch.float32)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    model, optimizer = fabric.setup(model, optimizer)
    times, losses = step_bench.accumulation_loop(
        model, optimizer, samples, steps, ACCUMULATION, backward=fabric.backward,
        no_sync=lambda last: fabric.no_backward_sync(model, enabled=not last))
    return step_bench.result("fabric", precision, times, losses, step_bench.peak_rss_mb())


def gradaccum_run(out, build, precision, steps, threads):
    return step_bench.gradaccum_train(
        os.path.join(build, "gradaccum"), os.path.join(out, f"run-{precision}"),
        {"model.hf_checkpoint": f"{out}/model", "data.type": "text", "data.path": f"{out}/train.jsonl",
         "data.tokenizer": tokenizer_dir(), "data.max_length": MAX_LENGTH, "data.eval_fraction": 0,
         "train_sampling_strategy": "sequential", "per_device_train_batch_size": 1,
         "gradient_accumulation_steps": ACCUMULATION, "max_steps": steps, "optim": "adamw", "weight_decay": 0,
         "learning_rate": LR, "lr_scheduler_type": "constant", "max_grad_norm": 0, "threads": threads,
         "mixed_precision": "bf16" if precision == "bf16" else "no"}, precision)


def compare(args):
    rows = []
    for precision in args.precisions.split(","):
        ours = gradaccum_run(args.dir, args.build, precision, args.steps, args.threads)
        print(json.dumps(ours), flush=True)
        theirs = step_bench.child_result(
            [sys.executable, __file__, "fabric", args.dir, "--precision", precision, "--steps", str(args.steps),
             "--threads", str(args.threads)])
        print(json.dumps(theirs), flush=True)
        rows.append((precision, ours, theirs))
    print("\n| precision | gradaccum s/step | Fabric s/step | time ratio | gradaccum peak RSS MB | Fabric peak RSS MB "
          "| RSS ratio | first window loss (ours / Fabric) |")
    print("|---|---|---|---|---|---|---|---|")
    for precision, ours, theirs in rows:
        print(f"| {precision} | {ours['s_per_step']:.1f} | {theirs['s_per_step']:.1f} | "
              f"{ours['s_per_step'] / theirs['s_per_step']:.2f} | {ours['peak_rss_mb']:.0f} | "
              f"{theirs['peak_rss_mb']:.0f} | {ours['peak_rss_mb'] / theirs['peak_rss_mb']:.2f} | "
              f"{ours['losses'][0]:.4f} / {theirs['losses'][0]:.4f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["prepare", "fabric", "compare"])
    ap.add_argument("dir")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    args = ap.parse_args()
    if args.command == "prepare":
        prepare(args.dir)
    elif args.command == "fabric":
        print(json.dumps(fabric_run(args.dir, args.precision, args.steps, args.threads)))
    else:
        compare(args)


if __name__ == "__main__":
    main()
