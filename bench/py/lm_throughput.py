#!/opt/gradaccum/venv/bin/python
"""Language-model throughput, the Python PyTorch loop (issue 3, item 7, fp32 and bf16).

The peer of bench/lm_throughput.cpp: the same GPT-2 written in plain torch (vocab 8192,
context 128, n_embd 192, 4 layers, 3 heads, pre-LayerNorm blocks, fused q/k/v, causal
masked softmax with the dtype's lowest value, GELU tanh, LM head tied to wte, no dropout;
HF's initialization drawn from a generator seeded 0 in registration order, as the engine
draws it, so both start from identical weights), on random token ids (labels = inputs),
micro-batch 8 x N = 4 in the standard accumulation loop: per micro-step
loss = mean cross-entropy of the shifted tokens / N, backward; every N micro-steps
clip_grad_norm_(1.0), AdamW (lr 1e-3, cosine schedule), zero_grad(set_to_none=True).

  /opt/gradaccum/venv/bin/python bench/py/lm_throughput.py [--threads 2] [--warmup-steps 2] [--steps 10]
      [--mixed-precision no|bf16] [--shape small|gpt2-124m|gpt2-124m-1024]
      [--loop eager|compile|accelerate|fabric] [--device cpu|cuda] [--trace FILE]

--shape: `small` (above) or `gpt2-124m`, GPT-2 small's shape (vocab 50257, 768 wide, 12 layers and
heads, 124M parameters) with context 256 at micro-batch 2 x N = 8, as bench/lm_throughput.cpp;
`gpt2-124m-1024` the same at GPT-2's own context of 1024, 8 x 4 (a GPU's shape).

--device cuda: model, data and GEMM probes on the first CUDA device. Attention then goes through
F.scaled_dot_product_attention with the engine's additive mask (0, or the dtype's lowest value),
the call the engine makes on CUDA, so both run the same attention kernel; the GEMM probes and
every optimizer step end with a device synchronize (the step's loss is read back once per step,
as the engine does). "peak_device_mb" is torch.cuda.max_memory_allocated().

--loop: how the accumulation loop is written, the stacks users run (fp32 only but eager):
  eager       the loop above, plain PyTorch
  compile     the same with model = torch.compile(model) (Inductor on CPU; the warm-up steps
              absorb the compilation)
  accelerate  HF Accelerate's documented loop (seed 004): Accelerator(gradient_accumulation_steps=N),
              accelerator.prepare, `with accelerator.accumulate(model)`, accelerator.backward(mean
              loss) (which divides by N), accelerator.clip_grad_norm_ and the step when
              accelerator.sync_gradients
  fabric      Lightning Fabric's (seed 001): Fabric(accelerator="cpu", devices=1), fabric.setup,
              `with fabric.no_backward_sync(model, enabled=not last)`, fabric.backward(loss / N),
              fabric.clip_gradients, step

--mixed-precision bf16: the forward and the loss run under torch.autocast("cpu",
dtype=torch.bfloat16), the backward outside it (PyTorch's AMP recipe); parameters, gradients
and AdamW stay float32. As in the engine, the attention softmax of the bfloat16 scores is
computed in float32.

Before and after training it measures the GEMM rate of this process (torch.mm of the model's
own shapes weighted by their uses per forward, and 2048^3 for reference; the peak is the faster
of the two probes), as the engine's program does, in the dtype of the model's matmuls (bfloat16 under bf16). Model FLOPs per token = 6 x P + 12 x n_layer x T x n_embd (P = parameters
without the position table). Forward, backward and the optimizer step are timed
separately (host clock; on CPU every op has finished when it returns). Prints one JSON line.
"""
import argparse
import contextlib
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cpu_kernels import loaded_kernels  # noqa: E402  (bench/cpu_kernels.py)

SHAPES = {  # vocab, context, n_embd, n_layer, n_head, micro-batch, accumulation
    "small": (8192, 128, 192, 4, 3, 8, 4),
    "gpt2-124m": (50257, 256, 768, 12, 12, 2, 8),
    "gpt2-124m-1024": (50257, 1024, 768, 12, 12, 8, 4),
}
VOCAB, CONTEXT, EMBD, LAYERS, HEADS, MICRO_BATCH, ACCUM = SHAPES["small"]


def use_shape(name):
    global VOCAB, CONTEXT, EMBD, LAYERS, HEADS, MICRO_BATCH, ACCUM
    VOCAB, CONTEXT, EMBD, LAYERS, HEADS, MICRO_BATCH, ACCUM = SHAPES[name]


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = torch.nn.Linear(EMBD, 3 * EMBD)
        self.c_proj = torch.nn.Linear(EMBD, EMBD)

    def forward(self, x, allowed):
        b, t, c = x.shape
        d = c // HEADS
        q, k, v = (z.view(b, t, HEADS, d).transpose(1, 2) for z in self.c_attn(x).split(c, dim=2))
        if x.is_cuda:
            bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(
                allowed.logical_not(), torch.finfo(q.dtype).min)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
        # bfloat16 scores (autocast) are normalized in float32, as the engine's masked_softmax
        # and CUDA autocast do; a no-op in float32.
        scores = scores.float()
        p = torch.softmax(scores.masked_fill(allowed.logical_not(), torch.finfo(scores.dtype).min), -1)
        y = torch.matmul(p, v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = torch.nn.Linear(EMBD, 4 * EMBD)
        self.c_proj = torch.nn.Linear(4 * EMBD, EMBD)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(EMBD, eps=1e-5)
        self.attn = Attention()
        self.ln_2 = torch.nn.LayerNorm(EMBD, eps=1e-5)
        self.mlp = Mlp()

    def forward(self, x, allowed):
        # The norms' inputs are the residual stream, float32 even under bf16 autocast (float32 +
        # bfloat16 promotes to float32), so libtorch 1.13's CPU autocast gap (LayerNorm of a
        # bfloat16 input with float32 weights fails) is not hit; the engine's GPT-2 is the same.
        x = x + self.attn(self.ln_1(x), allowed)
        return x + self.mlp(self.ln_2(x))


class Gpt2(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, EMBD)
        self.wpe = torch.nn.Embedding(CONTEXT, EMBD)
        self.h = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = torch.nn.LayerNorm(EMBD, eps=1e-5)
        # HF's _init_weights, in registration order from one generator (seed 0).
        g = torch.Generator()
        g.manual_seed(0)
        residual_std = 0.02 / math.sqrt(2 * LAYERS)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.startswith("ln_") or ".ln_" in name:
                    p.fill_(1.0) if name.endswith(".weight") else p.zero_()
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    p.normal_(0.0, residual_std if name.endswith("c_proj.weight") else 0.02, generator=g)

    def forward(self, ids):
        t = ids.size(1)
        allowed = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril().view(1, 1, t, t)
        x = self.wte(ids) + self.wpe(torch.arange(t, device=ids.device).unsqueeze(0))
        for block in self.h:
            x = block(x, allowed)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied LM head


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_rate(m, k, n, dtype, device, budget_s):
    a, b = torch.randn(m, k).to(device, dtype), torch.randn(k, n).to(device, dtype)
    c = torch.mm(a, b)
    synchronize(device)
    times, start = [], time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return 2.0 * m * k * n / statistics.median(times)


def shifted_loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def cosine(opt, peak_lr, step, total_steps):
    for group in opt.param_groups:  # cosine schedule over the run's steps
        group["lr"] = peak_lr * 0.5 * (1.0 + math.cos(math.pi * (step + 1) / total_steps))


def micro_batch(ids_all, step, s):
    first = (step * ACCUM + s) * MICRO_BATCH
    return ids_all[first:first + MICRO_BATCH]


class Eager:
    """The plain loop: loss = mean / N, loss.backward(), clip_grad_norm_."""

    def __init__(self, model, opt, bf16, device):
        self.model, self.opt, self.bf16, self.device = model, opt, bf16, device

    def accumulating(self, last):
        return contextlib.nullcontext()

    def loss(self, ids):
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return shifted_loss(self.model(ids), ids) / ACCUM

    def backward(self, loss):
        loss.backward()

    def window_term(self, loss):
        """This micro-step's share of the window's loss, a tensor (read back once per step)."""
        return loss.detach()

    def clip(self, params):
        torch.nn.utils.clip_grad_norm_(params, 1.0)


class Accelerate(Eager):
    """HF Accelerate's loop: `with accelerator.accumulate(model)`, accelerator.backward(mean loss),
    which divides by N, and accelerator.clip_grad_norm_ (its step runs when sync_gradients)."""

    def __init__(self, model, opt, bf16, device):
        from accelerate import Accelerator
        self.accelerator = Accelerator(gradient_accumulation_steps=ACCUM, cpu=device.type == "cpu")
        super().__init__(*self.accelerator.prepare(model, opt), bf16, device)

    def accumulating(self, last):
        return self.accelerator.accumulate(self.model)

    def loss(self, ids):
        return shifted_loss(self.model(ids), ids)

    def backward(self, loss):
        self.accelerator.backward(loss)

    def window_term(self, loss):
        return loss.detach() / ACCUM

    def clip(self, params):
        self.accelerator.clip_grad_norm_(params, 1.0)


class Fabric(Eager):
    """Lightning Fabric's loop: `with fabric.no_backward_sync(model, enabled=not last)`,
    fabric.backward(loss / N), fabric.clip_gradients."""

    def __init__(self, model, opt, bf16, device):
        import lightning
        self.fabric = lightning.Fabric(accelerator=device.type, devices=1, precision="32-true")
        super().__init__(*self.fabric.setup(model, opt), bf16, device)

    def accumulating(self, last):
        return self.fabric.no_backward_sync(self.model, enabled=not last)

    def backward(self, loss):
        self.fabric.backward(loss)

    def clip(self, params):
        self.fabric.clip_gradients(self.model, self.opt, max_norm=1.0)


def run_loop(stack, params, ids_all, total_steps, warmup, peak_lr, trace=None):
    """N micro-steps per window through `stack`, then clip, AdamW, zero_grad(set_to_none), schedule.

    With `trace`, torch.profiler records the steps after the warm-up (CPU operators) and writes them
    to that file as a Chrome trace, as lm_throughput --trace does."""
    ends, losses = [], []
    t_fwd = t_bwd = t_step = 0.0
    profiler = None
    for step in range(total_steps):
        timed = step >= warmup
        if trace and step == warmup:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
            profiler.__enter__()
        window_loss = 0.0
        for s in range(ACCUM):
            ids = micro_batch(ids_all, step, s)
            with stack.accumulating(last=s + 1 == ACCUM):
                t0 = time.perf_counter()
                loss = stack.loss(ids)
                t1 = time.perf_counter()
                stack.backward(loss)
                t2 = time.perf_counter()
            window_loss += stack.window_term(loss)
            if timed:
                t_fwd += t1 - t0
                t_bwd += t2 - t1
        t0 = time.perf_counter()
        stack.clip(params)
        stack.opt.step()
        stack.opt.zero_grad(set_to_none=True)
        cosine(stack.opt, peak_lr, step, total_steps)
        losses.append(float(window_loss))  # waits for the step on a GPU
        ends.append(time.perf_counter())
        if timed:
            t_step += ends[-1] - t0
    if profiler is not None:
        profiler.__exit__(None, None, None)
        profiler.export_chrome_trace(trace)
    return ends, losses, t_fwd, t_bwd, t_step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--mixed-precision", choices=["no", "bf16"], default="no")
    ap.add_argument("--shape", choices=list(SHAPES), default="small")
    ap.add_argument("--loop", choices=["eager", "compile", "accelerate", "fabric"], default="eager")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--trace", help="write the timed steps' CPU operators to this file (Chrome trace)")
    args = ap.parse_args()
    if args.trace and (args.device != "cpu" or args.warmup_steps < 1):
        ap.error("--trace needs --device cpu and --warmup-steps >= 1")
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if args.loop != "eager" and args.mixed_precision != "no":
        ap.error("--loop other than eager runs fp32 only")
    use_shape(args.shape)
    bf16 = args.mixed_precision == "bf16"
    gemm_dtype = torch.bfloat16 if bf16 else torch.float32  # the dtype of the model's matmuls
    torch.set_num_threads(args.threads)
    torch.manual_seed(42)

    def gemm_peak():
        """GEMM FLOP/s of the model's forward shapes (weighted by uses) and of 2048^3."""
        tokens = MICRO_BATCH * CONTEXT
        shapes = [("c_attn", EMBD, 3 * EMBD, LAYERS), ("attn.c_proj", EMBD, EMBD, LAYERS),
                  ("c_fc", EMBD, 4 * EMBD, LAYERS), ("mlp.c_proj", 4 * EMBD, EMBD, LAYERS),
                  ("lm_head", EMBD, VOCAB, 1)]
        mix_flops = mix_time = 0.0
        per_shape = {}
        for name, k, n, uses in shapes:
            rate = gemm_rate(tokens, k, n, gemm_dtype, device, 0.5)
            flops = 2.0 * tokens * k * n * uses
            mix_flops += flops
            mix_time += flops / rate
            per_shape[name] = round(rate / 1e9, 2)
        return mix_flops / mix_time, gemm_rate(2048, 2048, 2048, gemm_dtype, device, 1.0), per_shape

    model_before, square_before, per_shape = gemm_peak()

    model = Gpt2()
    params = list(model.parameters())
    parameters = sum(p.numel() for p in params)
    matmul_parameters = parameters - CONTEXT * EMBD
    flops_per_token = 6.0 * matmul_parameters + 12.0 * LAYERS * CONTEXT * EMBD

    total_steps = args.warmup_steps + args.steps
    g = torch.Generator()
    g.manual_seed(1234)
    ids_all = torch.randint(VOCAB, (total_steps * MICRO_BATCH * ACCUM, CONTEXT), generator=g).to(device)
    model = model.to(device)
    params = list(model.parameters())
    peak_lr = 1e-3
    opt = torch.optim.AdamW(params, lr=peak_lr, weight_decay=0.0)
    if args.loop == "compile":
        model = torch.compile(model)
    stack = {"eager": Eager, "compile": Eager, "accelerate": Accelerate, "fabric": Fabric}[args.loop](model, opt, bf16, device)
    start = time.perf_counter()
    ends, losses, t_fwd, t_bwd, t_step = run_loop(stack, params, ids_all, total_steps, args.warmup_steps, peak_lr,
                                                 args.trace)

    # Probed again after training; the peak is the faster probe of the two (the
    # probe's rate is bimodal on this machine, see BENCHMARKS.md).
    model_after, square_after, _ = gemm_peak()
    gemm_model = max(model_before, model_after)
    gemm_square = max(square_before, square_after)

    w = args.warmup_steps
    step_s = [ends[s] - (start if s == 0 else ends[s - 1]) for s in range(w, total_steps)]
    timed_s = ends[-1] - (start if w == 0 else ends[w - 1])
    tokens_per_s = MICRO_BATCH * ACCUM * CONTEXT * args.steps / timed_s
    model_flops = tokens_per_s * flops_per_token
    print(json.dumps({
        "program": "python-" + args.loop, "loop": args.loop, "shape": args.shape, "cpu_kernels": loaded_kernels(), "mixed_precision": args.mixed_precision,
        "gemm_dtype": "bfloat16" if bf16 else "float32", "threads": args.threads, "vocab": VOCAB, "context": CONTEXT,
        "n_embd": EMBD, "n_layer": LAYERS, "n_head": HEADS, "micro_batch": MICRO_BATCH,
        "accum": ACCUM, "parameters": parameters, "matmul_parameters": matmul_parameters,
        "flops_per_token": flops_per_token, "warmup_steps": w, "steps": args.steps,
        "tokens_per_s": round(tokens_per_s, 1), "s_per_step": round(statistics.median(step_s), 4),
        "s_per_step_min": round(min(step_s), 4), "model_gflops": round(model_flops / 1e9, 2),
        "gemm_model_gflops": round(gemm_model / 1e9, 2),
        "gemm_square_gflops": round(gemm_square / 1e9, 2), "gemm_shapes_gflops": per_shape,
        "gemm_model_gflops_before_after": [round(model_before / 1e9, 2), round(model_after / 1e9, 2)],
        "gemm_square_gflops_before_after": [round(square_before / 1e9, 2), round(square_after / 1e9, 2)],
        "fraction_of_gemm_model": round(model_flops / gemm_model, 3),
        "fraction_of_gemm_square": round(model_flops / gemm_square, 3),
        "first_loss": round(losses[0], 4), "final_loss": round(losses[-1], 4),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "peak_device_mb": round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if device.type == "cuda" else 0.0,
        "profile_s_per_step": {"forward_loss": round(t_fwd / args.steps, 4),
                               "backward": round(t_bwd / args.steps, 4),
                               "clip_adamw": round(t_step / args.steps, 4)},
    }))


if __name__ == "__main__":
    main()
