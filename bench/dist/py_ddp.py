#!/opt/gradaccum/venv/bin/python
"""The Python PyTorch peer of `gradaccum train` in data parallel: DistributedDataParallel
on Gloo with gradient accumulation.

Same model as gradaccum's `model.type=mlp, model.norm=none` (Flatten, then per hidden
width Linear + ReLU, then Linear(., 10)), same data (Fashion-MNIST train split, the first
--train-limit images, normalized per micro-batch), same decomposition (window of
B = b * N * W samples from a seeded permutation, micro-step s of rank r takes b of them),
same math (cross-entropy summed over the window and divided by B, AdamW lr 2e-3 with a
cosine schedule, clipping at 1.0, one small all-reduce of the loss totals per step as
gradaccum does).

--model gpt: instead, the 3.3M-parameter GPT-2 of bench/py/lm_throughput.py (its Gpt2 class:
vocab 8192, context 128, n_embd 192, 4 layers, 3 heads, tied head, initialized from a seed-0
generator like gradaccum's model with seed 0, bench/dist/gpt-3m.yaml) on rows of random token
ids (labels = inputs), a window of B = b * N * W rows drawn per step from a generator seeded
with (seed, step); the loss is the cross-entropy of the shifted tokens summed over the window
and divided by its token count B * 127, AdamW lr 1e-3 with a cosine schedule, clipping at 1.0.

--mode deferred: `with ddp.no_sync():` on the first N-1 micro-steps, so DDP all-reduces
only during the last backward (what the DDP docs recommend for accumulation).
--mode eager: no no_sync(), DDP all-reduces during every backward.
--mode accelerate: HF Accelerate's loop (seed 004): Accelerator(gradient_accumulation_steps=N)
prepares the model (DDP on Gloo) and the optimizer, each micro-step runs inside
`accelerator.accumulate(model)` (no_sync() but on the window's last micro-step) and
`accelerator.backward`, which divides the loss by N itself. Launch it with torchrun:
  torchrun --nproc-per-node 2 bench/dist/py_ddp.py --mode accelerate --output m.jsonl

--mode fsdp2: PyTorch FSDP2 (`fully_shard` on each block, or each Linear of the MLP, then on the
model; a Gloo device mesh on the CPU): parameters sharded per unit, gradients reduce-scattered in
every backward (FSDP2's default). --mode fsdp2_deferred: `set_requires_gradient_sync(False)` on
the first N-1 micro-steps, so it keeps unsharded gradients and reduce-scatters once, in the last.

Launched like torchrun would, one process per rank, with RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT (and GLOO_SOCKET_IFNAME) in the environment:
  RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 /opt/gradaccum/venv/bin/python bench/dist/py_ddp.py --output m.jsonl &
  RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 /opt/gradaccum/venv/bin/python bench/dist/py_ddp.py
Rank 0 writes one JSON object per optimizer step to --output, with the fields gradaccum's
metrics.jsonl uses (step, loss, step_time_s, allreduce_calls, allreduce_bytes, world_size).
allreduce_bytes is computed (gradient bytes x all-reducing backwards per step, what DDP's
default allreduce hook sends as bucket contents); DDP does not report it.
"""
import argparse
import contextlib
import gzip
import json
import math
import os
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cpu_kernels import loaded_kernels  # noqa: E402  (bench/cpu_kernels.py)

DATA_DIR = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530


def read_images(path: str, limit: int) -> torch.Tensor:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    n, rows, cols = struct.unpack(">iii", raw[4:16])
    data = torch.frombuffer(bytearray(raw[16:]), dtype=torch.uint8).view(n, rows, cols)
    return data[:limit] if limit > 0 else data


def read_labels(path: str, limit: int) -> torch.Tensor:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    labels = torch.frombuffer(bytearray(raw[8:]), dtype=torch.uint8).long()
    return labels[:limit] if limit > 0 else labels


def make_mlp(hidden, classes=10):
    layers = [nn.Flatten()]
    width = 28 * 28
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def gpt_model():
    """The GPT of bench/py/lm_throughput.py and its context length."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
    import lm_throughput
    return lm_throughput.Gpt2(), lm_throughput.VOCAB, lm_throughput.CONTEXT


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "gpt"], default="mlp")
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--accum", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--hidden", default="2048,2048,2048")
    ap.add_argument("--mode", choices=["deferred", "eager", "accelerate", "fsdp2", "fsdp2_deferred"],
                    default="deferred")
    ap.add_argument("--train-limit", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--output", default="")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    accelerator = None
    if args.mode == "accelerate":
        from accelerate import Accelerator
        # cpu=True under torchrun's environment: Accelerate's MULTI_CPU state, a Gloo group.
        accelerator = Accelerator(gradient_accumulation_steps=args.accum, cpu=True)
        torch.set_num_threads(args.threads)  # Accelerate may have set its own count
    else:
        dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()

    b, N = args.micro_batch, args.accum
    B = b * N * world
    gpt = args.model == "gpt"
    if gpt:
        model, vocab, context = gpt_model()
        items_per_micro = b * (context - 1)  # predicted tokens
        lr = 1e-3
    else:
        images = read_images(os.path.join(DATA_DIR, "train-images-idx3-ubyte.gz"), args.train_limit)
        labels = read_labels(os.path.join(DATA_DIR, "train-labels-idx1-ubyte.gz"), args.train_limit)
        n = images.shape[0]
        windows_per_epoch = n // B
        assert windows_per_epoch > 0, "--train-limit smaller than one window"
        torch.manual_seed(args.seed)
        model = make_mlp([int(h) for h in args.hidden.split(",")])
        items_per_micro = b
        lr = 2e-3

    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    fsdp = args.mode.startswith("fsdp2")
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for unit in (model.h if gpt else [m for m in model if isinstance(m, nn.Linear)]):
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)  # every rank built the same weights from the same seed
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)  # after sharding: its DTensors
    if fsdp:
        ddp = model
    elif accelerator is not None:
        from accelerate.utils import DistributedDataParallelKwargs
        accelerator.ddp_handler = DistributedDataParallelKwargs(bucket_cap_mb=int(args.bucket_cap_mb))
        ddp, opt = accelerator.prepare(model, opt)  # DDP: broadcasts rank 0's weights
    else:
        ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)  # broadcasts rank 0's weights
    total = args.max_steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total)))

    out = open(args.output, "w") if (rank == 0 and args.output) else None
    cpu_kernels = loaded_kernels()
    perm = None
    for step in range(args.max_steps):
        if gpt:
            # The whole window's rows (every rank draws the same), before the clock starts.
            g = torch.Generator()
            g.manual_seed(args.seed * 1_000_003 + step)
            window_ids = torch.randint(vocab, (B, context), generator=g)
        else:
            epoch, k = divmod(step, windows_per_epoch)
            if k == 0:
                g = torch.Generator()
                g.manual_seed(args.seed + epoch)
                perm = torch.randperm(n, generator=g)
            window = perm[k * B:(k + 1) * B]
        start = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float64)
        for s in range(N):
            first = (s * world + rank) * b
            sync_now = args.mode in ("eager", "fsdp2") or s == N - 1
            if fsdp:
                model.set_requires_gradient_sync(sync_now)
                ctx = contextlib.nullcontext()
            elif accelerator is not None:
                ctx = accelerator.accumulate(ddp)  # its own step count: syncs on every N-th micro-step
            else:
                ctx = contextlib.nullcontext() if sync_now else ddp.no_sync()
            with ctx:
                if gpt:
                    ids = window_ids[first:first + b]
                    logits = ddp(ids)
                    loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1),
                                           reduction="sum")
                else:
                    idx = window[first:first + b]
                    x = (images[idx].float().div_(255.0) - MEAN) / STD
                    logits = ddp(x)
                    loss = F.cross_entropy(logits, labels[idx], reduction="sum")
                # DDP averages over W ranks: / (items per rank and window) here makes the
                # gradient that of the window's sum / its item count (samples, or tokens).
                if accelerator is not None:
                    accelerator.backward(loss / items_per_micro)  # Accelerate divides by N
                else:
                    (loss / (items_per_micro * N)).backward()
            loss_sum += loss.detach().double()
        totals = torch.stack([loss_sum, torch.tensor(float(items_per_micro * N), dtype=torch.float64)])
        dist.all_reduce(totals)
        if accelerator is not None:
            assert accelerator.sync_gradients, "the window's last micro-step must have synchronized"
            grad_norm = accelerator.clip_grad_norm_(ddp.parameters(), 1.0)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if hasattr(grad_norm, "full_tensor"):
                grad_norm = grad_norm.full_tensor()  # FSDP2: a DTensor
        opt.step()
        opt.zero_grad()
        sched.step()
        host = torch.stack([totals[0] / totals[1], grad_norm.double()]).tolist()  # the one host sync
        step_time = time.perf_counter() - start
        if out:
            syncs = N if args.mode in ("eager", "fsdp2") else 1  # accelerate: deferred, like no_sync()
            out.write(json.dumps({
                "step": step + 1, "loss": host[0], "grad_norm": host[1],
                "step_time_s": step_time, "world_size": world,
                "allreduce_bytes": grad_bytes * syncs,
                "mode": args.mode, "model": args.model, "micro_batch": b, "accum": N,
                "cpu_kernels": cpu_kernels,
            }) + "\n")
            out.flush()
    if out:
        out.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
