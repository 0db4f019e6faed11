#!/opt/gradaccum/venv/bin/python
"""A Linear layer on [batch, time, features]: matmul + bias add vs one addmm (models/linear.h).

libtorch 1.13's C++ frontend (torch::nn::Linear) computes a 3-D Linear as matmul(x, Wᵀ)
followed by `+= bias`; ATen's linear (Python's F.linear, gradaccum's models::linear) runs
one addmm with the bias broadcast into C and beta = 1, which spares OpenBLAS its pass that
clears C (sgemm_beta) and the separate bias pass. Both are timed here on the forward
shapes of bench/lm_throughput's GPT-2 (8 × 128 tokens, n_embd 192), alternating, as the
median of `--repeats` calls each; both use the same libtorch and system BLAS as gradaccum.

  /opt/gradaccum/venv/bin/python bench/py/linear_bias_fusion.py [--threads 2] [--repeats 200]
"""
import argparse
import statistics
import time

import torch


def median_ms(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print("| Linear (in → out) | matmul + bias add, ms | addmm (F.linear), ms | ratio |")
    print("|---|---|---|---|")
    total_split = total_fused = 0.0
    for name, fan_in, fan_out in (("c_attn", 192, 576), ("attn.c_proj", 192, 192),
                                  ("c_fc", 192, 768), ("mlp.c_proj", 768, 192)):
        x = torch.randn(8, 128, fan_in)
        w = torch.randn(fan_out, fan_in)
        b = torch.randn(fan_out)
        split = median_ms(lambda: torch.matmul(x, w.t()).add_(b), args.repeats)
        fused = median_ms(lambda: torch.nn.functional.linear(x, w, b), args.repeats)
        total_split += split
        total_fused += fused
        print(f"| {name} ({fan_in} → {fan_out}) | {split:.3f} | {fused:.3f} | {fused / split:.3f} |")
    print(f"| one block's four | {total_split:.3f} | {total_fused:.3f} | {total_fused / total_split:.3f} |")


if __name__ == "__main__":
    main()
