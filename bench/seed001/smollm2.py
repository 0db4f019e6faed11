#!/opt/gradaccum/venv/bin/python
"""Seed 001's step with real weights: the SmolLM2-135M classifier on the movie reviews at 1 x 16
(configs/seed001-smollm2.yaml), gradaccum against HF's LlamaForSequenceClassification in four peers.

  smollm2.py prepare DIR [--reviews 320]        # the model (save_pretrained) and the data, once
  smollm2.py peer DIR --program eager|compile|fabric|trainer --precision fp32|bf16 [--steps 3] [--threads 2]
  smollm2.py compare DIR [--build build] [--steps 3] [--precisions fp32,bf16] [--runs 1] [--threads 2]
      [--peers eager,fabric,compile,trainer]

prepare: transformers loads the GGUF (`from_pretrained(dir, gguf_file=name)`, dequantized to float32)
as LlamaForSequenceClassification with 2 labels and a fresh `score` drawn after torch.manual_seed(0),
pad_token_id set to <|endoftext|>'s id (0) as gradaccum sets it for a classifier (io/workload.cpp),
and save_pretrained writes it and transformers' tokenizer for the GGUF to DIR/model, so both sides
start from the same float32 weights. DIR/train.jsonl: --reviews reviews of
/var/lib/gradaccum/data/movie-reviews/reviews.csv in file order within each class, the classes
alternating (label 0 = "-1", 1 = "1", the config's name order); DIR/train_ids.jsonl: the same
reviews' first 128 token ids by that tokenizer (no special tokens, as gradaccum encodes), for the peers.

Every program: the same reviews in the same order, micro-batch 1 x 16 accumulation steps, AdamW
(lr 5e-5, weight decay 0), constant schedule, gradient clipping at 1.0 (the config's), `--steps`
optimizer steps, 2 threads; seconds per optimizer step = the median over the steps after the first;
peak RSS of the process. fp32, or bf16 autocast of the forward and the loss (weights, gradients and
AdamW in float32).
- gradaccum: `gradaccum train configs/seed001-smollm2.yaml` with model.hf_checkpoint=DIR/model,
  data.path=DIR/train.jsonl, no validation or test split (so nothing is evaluated), sequential
  order, max_steps, threads, mixed_precision no|bf16; its metrics.jsonl's step_time_s / peak_rss_mb.
- eager: the plain loop (loss / 16, backward; clip_grad_norm_, step, zero_grad), torch.autocast
  for bf16.
- compile: the same loop on torch.compile(model) (inductor); the first step pays for compiling.
- fabric: Lightning Fabric (precision "32-true" | "bf16-mixed"), `no_backward_sync` on all but the
  window's last micro-batch, fabric.backward, fabric.clip_gradients (the seed's stack).
- trainer: HF Trainer (per_device_train_batch_size 1, gradient_accumulation_steps 16, adamw_torch,
  max_grad_norm 1.0, train_sampling_strategy sequential, bf16=True for bf16); a step's time is the
  interval between its callback's on_step_end and the one before (on_train_begin for the first);
  the model's accepts_loss_kwargs set False, else the Trainer skips dividing the classifier's
  loss by 16 (see trainer_run).

compare runs --runs rounds, each one process of every program per precision, one at a time (the
program order rotating per round), under the shared benchmark lock (/tmp/gradaccum-bench.lock), with
the peers on gradaccum's CPU kernels (bench/cpu_kernels.py); prints each process's JSON line and a
Markdown table of medians over the rounds, and the load average before and after.
"""
import argparse
import csv
import fcntl
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import step_bench  # noqa: E402  (bench/seed001/step_bench.py)

GGUF = "/var/lib/gradaccum/models/SmolLM2-135M-Instruct.Q4_1.gguf"
REVIEWS = "/var/lib/gradaccum/data/movie-reviews/reviews.csv"
CONFIG = os.path.join(REPO, "configs", "seed001-smollm2.yaml")
LOCK = "/tmp/gradaccum-bench.lock"
ACCUMULATION = 16
LR = 5e-5
MAX_GRAD_NORM = 1.0
MAX_LENGTH = 128
PAD_TOKEN = "<|endoftext|>"  # gradaccum pads a classifier's batches with it (io/workload.cpp)
PEERS = ("eager", "fabric", "compile", "trainer")


def prepare(out, count):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    os.makedirs(out, exist_ok=True)
    with open(REVIEWS, encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f))
    by_class = {0: [r[1] for r in rows if r[0] == "-1"], 1: [r[1] for r in rows if r[0] == "1"]}
    assert min(len(v) for v in by_class.values()) * 2 >= count, "not enough reviews"
    reviews = [(by_class[k % 2][k // 2], k % 2) for k in range(count)]

    gguf_dir, gguf_name = os.path.split(GGUF)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    with open(os.path.join(out, "train.jsonl"), "w") as texts, open(os.path.join(out, "train_ids.jsonl"), "w") as ids:
        for text, label in reviews:
            texts.write(json.dumps({"text": text, "label": label}) + "\n")
            tokens = tokenizer(text, add_special_tokens=False)["input_ids"][:MAX_LENGTH]
            ids.write(json.dumps({"input_ids": tokens, "label": label}) + "\n")

    torch.manual_seed(0)
    loaded = LlamaForSequenceClassification.from_pretrained(gguf_dir, gguf_file=gguf_name, num_labels=2,
                                                            dtype=torch.float32)
    # A model loaded from a GGUF refuses save_pretrained (transformers counts it as quantized, though
    # its weights are dequantized float32): the same weights in a plain model of the same config.
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    config.update(pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN), id2label={0: "-1", 1: "1"},
                  label2id={"-1": 0, "1": 1}, dtype="float32")
    model = LlamaForSequenceClassification(LlamaConfig.from_dict(config))
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(os.path.join(out, "model"))
    tokenizer.save_pretrained(os.path.join(out, "model"))
    print(json.dumps({"parameters": sum(p.numel() for p in model.parameters()), "reviews": count,
                      "pad_token_id": model.config.pad_token_id}))


def load_samples(out, steps):
    import torch

    with open(os.path.join(out, "train_ids.jsonl")) as f:
        records = [json.loads(line) for line in f][:steps * ACCUMULATION]
    assert len(records) == steps * ACCUMULATION, f"{out}/train_ids.jsonl: fewer than {steps} windows; prepare more"
    return [{"input_ids": torch.tensor([r["input_ids"]]), "labels": torch.tensor([r["label"]])} for r in records]


def load_model(out):
    import torch
    from transformers import LlamaForSequenceClassification

    model = LlamaForSequenceClassification.from_pretrained(os.path.join(out, "model"), dtype=torch.float32)
    return model.train()


def loop_run(out, program, precision, steps):
    """eager and compile: the plain accumulation loop."""
    import torch

    samples = load_samples(out, steps)
    model = load_model(out)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    forward = torch.compile(model) if program == "compile" else model
    times, losses = step_bench.accumulation_loop(
        forward, optimizer, samples, steps, ACCUMULATION,
        autocast=(lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else None,
        clip=lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM))
    return step_bench.result(program, precision, times, losses, step_bench.peak_rss_mb())


def fabric_run(out, precision, steps):
    import lightning
    import torch

    samples = load_samples(out, steps)
    fabric = lightning.Fabric(accelerator="cpu", devices=1, precision="bf16-mixed" if precision == "bf16" else "32-true")
    model = load_model(out)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    model, optimizer = fabric.setup(model, optimizer)
    times, losses = step_bench.accumulation_loop(
        model, optimizer, samples, steps, ACCUMULATION, backward=fabric.backward,
        no_sync=lambda last: fabric.no_backward_sync(model, enabled=not last),
        clip=lambda: fabric.clip_gradients(model, optimizer, max_norm=MAX_GRAD_NORM))
    return step_bench.result("fabric", precision, times, losses, step_bench.peak_rss_mb())


def trainer_run(out, precision, steps):
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    samples = [{k: v[0] for k, v in s.items()} for s in load_samples(out, steps)]

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(samples)

        def __getitem__(self, i):
            return samples[i]

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.times, self.losses, self.mark = [], [], None

        def on_train_begin(self, args, state, control, **kwargs):
            self.mark = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            self.times.append(now - self.mark)
            self.mark = now

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.losses.append(logs["loss"])

    args = TrainingArguments(
        output_dir=os.path.join(out, f"trainer-{precision}"), per_device_train_batch_size=1,
        gradient_accumulation_steps=ACCUMULATION, max_steps=steps, learning_rate=LR, weight_decay=0.0,
        optim="adamw_torch", lr_scheduler_type="constant", max_grad_norm=MAX_GRAD_NORM,
        train_sampling_strategy="sequential", bf16=precision == "bf16", use_cpu=True, logging_steps=1,
        save_strategy="no", report_to=[], dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True)
    model = load_model(out)
    # The classifier's forward takes **kwargs, so the Trainer assumes the loss is already divided by
    # the window's num_items_in_batch and leaves out its division by gradient_accumulation_steps;
    # the classification loss takes no such count, which makes the window's gradient 16 times its
    # mean's. accepts_loss_kwargs = False restores the division (HF's own switch for this).
    model.accepts_loss_kwargs = False
    callback = StepTimes()
    Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[callback]).train()
    return step_bench.result("trainer", precision, callback.times, callback.losses, step_bench.peak_rss_mb())


def peer(args):
    import torch

    torch.set_num_threads(args.threads)
    try:
        if args.program == "fabric":
            out = fabric_run(args.dir, args.precision, args.steps)
        elif args.program == "trainer":
            out = trainer_run(args.dir, args.precision, args.steps)
        else:
            out = loop_run(args.dir, args.program, args.precision, args.steps)
    except Exception as e:  # a peer that cannot run here (torch.compile on the CPU) is a result too
        out = {"program": args.program, "precision": args.precision,
               "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"}
    print(json.dumps(out))


def gradaccum_run(args, precision, round_):
    return step_bench.gradaccum_train(
        os.path.join(args.build, "gradaccum"), os.path.join(args.dir, f"run-gradaccum-{precision}-{round_}"),
        {"model.hf_checkpoint": f"{args.dir}/model", "data.tokenizer": f"{args.dir}/model",
         "data.path": f"{args.dir}/train.jsonl", "data.text_field": "text", "data.label_field": "label",
         "data.labels": "index", "data.eval_fraction": 0, "data.test_fraction": 0,
         "train_sampling_strategy": "sequential", "max_steps": args.steps, "eval_steps": 0, "logging_steps": 1,
         "threads": args.threads, "mixed_precision": "bf16" if precision == "bf16" else "no"},
        precision, config=CONFIG)


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
    return {"avx512f": "avx512f" in flags, "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags}


def uptime():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def compare(args):
    from cpu_kernels import match_cpu_kernels  # bench/cpu_kernels.py

    kernels = match_cpu_kernels(os.path.join(args.build, "gradaccum"))
    peers = args.peers.split(",")
    assert all(p in PEERS for p in peers), f"--peers: each of {','.join(PEERS)}"
    programs = ["gradaccum"] + peers
    print(json.dumps({"kernels": kernels, "cpu": cpu_flags(), "load_before": uptime()}), flush=True)
    lock = open(LOCK, "w")
    waited = time.time()
    fcntl.flock(lock, fcntl.LOCK_EX)
    print(json.dumps({"lock_waited_s": round(time.time() - waited, 1)}), flush=True)
    results = {}
    for round_ in range(args.runs):
        for precision in args.precisions.split(","):
            order = programs[round_ % len(programs):] + programs[:round_ % len(programs)]
            for program in order:
                if program == "gradaccum":
                    r = gradaccum_run(args, precision, round_)
                else:
                    r = step_bench.child_result(
                        [sys.executable, __file__, "peer", args.dir, "--program", program, "--precision", precision,
                         "--steps", str(args.steps), "--threads", str(args.threads)])
                r["load"] = uptime()
                print(json.dumps(r), flush=True)
                results.setdefault((precision, program), []).append(r)
    lock.close()
    print(json.dumps({"load_after": uptime()}), flush=True)
    print_table(results, args, programs)


def print_table(results, args, programs):
    print(f"\n{args.runs} process(es) per program and precision, {args.steps} optimizer steps each; s/step: the median "
          "over the steps after the first, then over processes; ratios gradaccum / peer.\n")
    print("| precision | program | s/step | samples/s | gradaccum's samples/s ratio | peak RSS MB | gradaccum's RSS "
          "ratio | first window loss |")
    print("|---|---|---|---|---|---|---|---|")
    for precision in args.precisions.split(","):
        ours = [r for r in results[(precision, "gradaccum")]]
        our_s = statistics.median(r["s_per_step"] for r in ours)
        our_rss = statistics.median(r["peak_rss_mb"] for r in ours)
        for program in programs:
            runs = results[(precision, program)]
            failed = [r["error"] for r in runs if "error" in r]
            if failed:
                print(f"| {precision} | {program} | failed: {failed[0]} | | | | | |")
                continue
            s = statistics.median(r["s_per_step"] for r in runs)
            rss = statistics.median(r["peak_rss_mb"] for r in runs)
            ratio = "" if program == "gradaccum" else f"**{s / our_s:.2f}×**"
            rss_ratio = "" if program == "gradaccum" else f"**{our_rss / rss:.2f}×**"
            print(f"| {precision} | {program} | {s:.2f} | {ACCUMULATION / s:.2f} | {ratio} | {rss:.0f} | {rss_ratio} | "
                  f"{runs[0]['losses'][0]:.4f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["prepare", "peer", "compare"])
    ap.add_argument("dir")
    ap.add_argument("--reviews", type=int, default=320, help="prepare: how many reviews (16 per optimizer step)")
    ap.add_argument("--program", choices=PEERS, default="eager")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    args = ap.parse_args()
    if args.command == "prepare":
        prepare(args.dir, args.reviews)
    elif args.command == "peer":
        peer(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
