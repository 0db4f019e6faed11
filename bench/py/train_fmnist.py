#!/opt/gradaccum/venv/bin/python
"""The Python PyTorch peer of `gradaccum train` with the default configuration.

Same model (small_cnn: conv3x3 32/64 without bias, GroupNorm(8), ReLU, MaxPool2d(2),
Linear(3136, 128), ReLU, Linear(128, 10)), same data (Fashion-MNIST train split read
from the gzip IDX files, kept as uint8 and normalized per micro-batch), same order
(per epoch torch.randperm(n) from a generator seeded with gradaccum's epoch_seed),
same decomposition (window k = permutation[kB, (k+1)B), cut into micro-batches of b),
same math (loss = sum of cross-entropy over the window / samples in the window,
AdamW lr 2e-3 with a cosine schedule over the run's steps, clipping at 1.0).

Run with the venv's interpreter (scripts/setup.sh), which has torch:
  /opt/gradaccum/venv/bin/python bench/py/train_fmnist.py --micro-batch 16 --accum 4 --max-steps 60 --threads 2
Prints one JSON line; samples_per_s counts only the steps after --warmup-steps.

--loop: how the accumulation loop is written (the stacks users run; the math is the same on full
windows, which are all a run of --max-steps < 938 sees):
  eager       the loop above, plain PyTorch
  compile     the same with model = torch.compile(model) (Inductor on CPU; the warm-up steps
              absorb the compilation)
  accelerate  HF Accelerate's documented loop: `with accelerator.accumulate(model)`,
              accelerator.backward(mean loss) (which divides by N), accelerator.clip_grad_norm_
  fabric      Lightning Fabric's: `with fabric.no_backward_sync(model, enabled=not last)`,
              fabric.backward(mean loss / N), fabric.clip_gradients
--memory-format channels_last: the same with PyTorch's channels-last recipe (gradaccum's
model.memory_format: auto does the same on the CPU).
"""
import argparse
import gzip
import json
import math
import os
import resource
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cpu_kernels import loaded_kernels  # noqa: E402  (bench/cpu_kernels.py)

DATA_DIR = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # statistics of the training images (pixel / 255)
MASK64 = (1 << 64) - 1


def epoch_seed(seed: int, epoch: int) -> int:
    """gradaccum::core::WindowPlan::epoch_seed: splitmix64(seed + (epoch + 1) * golden)."""
    z = (seed + (epoch + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    g = torch.Generator()
    g.manual_seed(epoch_seed(seed, epoch))
    return torch.randperm(n, generator=g)


def read_idx_gz(path: str) -> torch.Tensor:
    """A gzip-compressed IDX file (big-endian int32 magic and sizes, uint8 data)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, = struct.unpack(">i", raw[:4])
    dims = magic & 0xFF
    assert magic >> 8 == 0x08, f"{path}: not a uint8 IDX file"
    shape = struct.unpack(f">{dims}i", raw[4:4 + 4 * dims])
    data = torch.frombuffer(bytearray(raw[4 + 4 * dims:]), dtype=torch.uint8)
    return data.view(*shape)


def load_fashion_mnist(directory: str = DATA_DIR):
    images = read_idx_gz(os.path.join(directory, "train-images-idx3-ubyte.gz"))
    labels = read_idx_gz(os.path.join(directory, "train-labels-idx1-ubyte.gz"))
    return images.unsqueeze(1).contiguous(), labels.long()


def small_cnn(channels=(32, 64), hidden=128, classes=10, groups=8) -> nn.Sequential:
    layers, c_in, side = [], 1, 28
    for c in channels:
        layers += [nn.Conv2d(c_in, c, 3, padding=1, bias=False), nn.GroupNorm(math.gcd(c, groups), c),
                   nn.ReLU(), nn.MaxPool2d(2)]
        c_in, side = c, side // 2
    layers += [nn.Flatten(), nn.Linear(c_in * side * side, hidden), nn.ReLU(), nn.Linear(hidden, classes)]
    return nn.Sequential(*layers)


def cosine_lr(peak: float, step: int, total: int) -> float:
    progress = min(1.0, step / max(1, total))
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup-steps", type=int, default=5, help="steps excluded from samples_per_s")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--data-dir", default=DATA_DIR)
    ap.add_argument("--loop", choices=["eager", "compile", "accelerate", "fabric"], default="eager")
    ap.add_argument("--memory-format", choices=["contiguous", "channels_last"], default="contiguous",
                    help="channels_last: PyTorch's recipe, model.to(memory_format=torch.channels_last) and each "
                    "input batch .contiguous(memory_format=torch.channels_last)")
    ap.add_argument("--trace", help="torch.profiler over the steps after --warmup-steps, written to this file as a "
                    "Chrome trace (as gradaccum's profile_from_step writes one)")
    args = ap.parse_args()
    assert args.max_steps > args.warmup_steps >= 0
    assert not args.trace or args.warmup_steps >= 1, "--trace needs --warmup-steps >= 1"
    profiler = None

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    images, labels = load_fashion_mnist(args.data_dir)  # not timed
    n = images.shape[0]
    b, accum = args.micro_batch, args.accum
    window = b * accum
    windows_per_epoch = math.ceil(n / window)  # last_window: partial

    model = small_cnn()
    model.train()
    memory_format = torch.channels_last if args.memory_format == "channels_last" else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cosine_lr(args.lr, 0, args.max_steps), betas=(0.9, 0.999),
                            eps=1e-8, weight_decay=0.0)
    accelerator = fabric = None
    if args.loop == "compile":
        model = torch.compile(model)
    elif args.loop == "accelerate":
        from accelerate import Accelerator
        accelerator = Accelerator(gradient_accumulation_steps=accum, cpu=True)
        model, opt = accelerator.prepare(model, opt)
    elif args.loop == "fabric":
        import lightning
        fabric = lightning.Fabric(accelerator="cpu", devices=1, precision="32-true")
        model, opt = fabric.setup(model, opt)

    step, epoch = 0, 0
    step_end_times, step_samples, losses, grad_norms = [], [], [], []
    t0 = time.perf_counter()
    while step < args.max_steps:
        perm = permutation(n, args.seed, epoch)
        for k in range(windows_per_epoch):
            if step >= args.max_steps:
                break
            if args.trace and step == args.warmup_steps:
                profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
                profiler.__enter__()
            idx_window = perm[k * window:(k + 1) * window]
            total = idx_window.shape[0]  # exact normalization: the window's own sample count
            window_loss = torch.zeros((), dtype=torch.float64)
            for s in range(0, total, b):
                idx = idx_window[s:s + b]
                x = images.index_select(0, idx).float().sub_(MEAN * 255.0).div_(STD * 255.0)
                x = x.contiguous(memory_format=memory_format)
                y = labels.index_select(0, idx)
                if accelerator is not None:
                    with accelerator.accumulate(model):
                        loss = F.cross_entropy(model(x), y)
                        accelerator.backward(loss)
                    loss_sum = loss.detach() * idx.shape[0]
                elif fabric is not None:
                    with fabric.no_backward_sync(model, enabled=s + b < total):
                        loss = F.cross_entropy(model(x), y) / accum
                        fabric.backward(loss)
                    loss_sum = loss.detach() * accum * idx.shape[0]
                else:
                    loss_sum = F.cross_entropy(model(x), y, reduction="sum")
                    (loss_sum / total).backward()
                window_loss += loss_sum.detach()
            if accelerator is not None:
                grad_norm = accelerator.clip_grad_norm_(params, args.max_grad_norm)
            elif fabric is not None:
                grad_norm = fabric.clip_gradients(model, opt, max_norm=args.max_grad_norm)
            else:
                grad_norm = torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            for group in opt.param_groups:  # the scheduler step
                group["lr"] = cosine_lr(args.lr, step, args.max_steps)
            losses.append(window_loss.item() / total)
            grad_norms.append(grad_norm.item())
            step_samples.append(total)
            step_end_times.append(time.perf_counter() - t0)
        epoch += 1
    if profiler is not None:
        profiler.__exit__(None, None, None)
        profiler.export_chrome_trace(args.trace)

    w = args.warmup_steps
    timed_samples = sum(step_samples[w:])
    timed_s = step_end_times[-1] - (step_end_times[w - 1] if w > 0 else 0.0)
    print(json.dumps({
        "program": "python-" + args.loop, "loop": args.loop, "memory_format": args.memory_format, "cpu_kernels": loaded_kernels(),
        "micro_batch": b, "accum": accum, "steps": step, "threads": args.threads,
        "warmup_steps": w,
        "samples_per_s": timed_samples / timed_s,
        "samples_per_s_all": sum(step_samples) / step_end_times[-1],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "first_loss": losses[0], "final_loss": losses[-1], "first_grad_norm": grad_norms[0],
        "losses": losses, "grad_norms": grad_norms,
    }))


if __name__ == "__main__":
    main()
