#!/opt/gradaccum/venv/bin/python
"""Seed 000's MLP micro-step benchmark, the Python PyTorch loop.

The peer of bench/mlp_microstep.cpp: Linear(16, 32) -> GELU -> Linear(32, 1) on an
in-memory dataset of random (x[16], y[1]) samples, micro-batch 1, 16 accumulation
steps; per micro-step: fetch (index_select), forward, squared-error sum, backward of
sum / 16 (the window's item count); every 16 micro-steps: clip at 1.0, AdamW step
(lr 1e-3, cosine schedule), zero_grad(set_to_none=True).

  /opt/gradaccum/venv/bin/python bench/py/mlp_microstep.py [--threads 1] [--warmup-steps 20] [--repeats 7] [--steps 50]

Prints one JSON line; us_per_micro_step is the median over `repeats` timed blocks of
`steps` optimizer steps each, after `warmup-steps` untimed steps.
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cpu_kernels import loaded_kernels  # noqa: E402  (bench/cpu_kernels.py)

MICRO_BATCH, ACCUM = 1, 16


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(42)
    total_steps = args.warmup_steps + args.repeats * args.steps
    n = total_steps * MICRO_BATCH * ACCUM
    x_all, y_all = torch.randn(n, 16), torch.randn(n, 1)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    params = list(net.parameters())
    peak_lr = 1e-3
    opt = torch.optim.AdamW(params, lr=peak_lr, weight_decay=0.0)
    g = torch.Generator()
    g.manual_seed(42)
    perm = torch.randperm(n, generator=g)

    ends = []
    start = time.perf_counter()
    window = MICRO_BATCH * ACCUM
    for step in range(total_steps):
        for s in range(ACCUM):
            idx = perm[step * window + s * MICRO_BATCH: step * window + (s + 1) * MICRO_BATCH]
            x, y = x_all.index_select(0, idx), y_all.index_select(0, idx)
            loss = (net(x) - y).square().sum()
            (loss / window).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        for group in opt.param_groups:  # cosine schedule over the run's steps
            group["lr"] = peak_lr * 0.5 * (1.0 + math.cos(math.pi * (step + 1) / total_steps))
        ends.append(time.perf_counter())

    per_repeat = []
    for r in range(args.repeats):
        first = args.warmup_steps + r * args.steps
        t0 = start if first == 0 else ends[first - 1]
        per_repeat.append((ends[first + args.steps - 1] - t0) / (args.steps * ACCUM) * 1e6)
    print(json.dumps({
        "program": "python", "cpu_kernels": loaded_kernels(), "threads": args.threads,
        "micro_batch": MICRO_BATCH, "accum": ACCUM,
        "warmup_steps": args.warmup_steps, "repeats": args.repeats, "steps_per_repeat": args.steps,
        "us_per_micro_step": round(statistics.median(per_repeat), 2),
        "us_per_micro_step_min": round(min(per_repeat), 2),
        "repeats_us": [round(v, 2) for v in per_repeat],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
    }))


if __name__ == "__main__":
    main()
