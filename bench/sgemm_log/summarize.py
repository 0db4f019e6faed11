#!/opt/gradaccum/venv/bin/python
"""Sums an sgemm_log.c log of bench/lm_throughput over its training micro-steps.

The window runs from the first LM-head forward GEMM ("TN" with m = vocab) to the last LM-head
weight-gradient GEMM ("NT" with n = vocab), so the GEMM peak probes before and after are left
out; micro-steps are counted by LM-head forwards (one chunk per micro-batch, the default).
Prints wall and GEMM milliseconds per micro-step, then GEMM time per shape and beta; products
under `--small` multiply-adds are pooled (attention's per-head blocks).

  /opt/gradaccum/venv/bin/python bench/sgemm_log/summarize.py LOG [--vocab 8192] [--small 33554432]
"""
import argparse
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--small", type=int, default=1024 * 64 * 64 * 8)
    args = ap.parse_args()
    calls = [line.split() for line in open(args.log)]
    heads = [i for i, c in enumerate(calls) if c[0] == "TN" and int(c[1]) == args.vocab]
    grads = [i for i, c in enumerate(calls) if c[0] == "NT" and int(c[2]) == args.vocab]
    if not heads or not grads:
        raise SystemExit(f"summarize: no LM-head GEMM with vocab {args.vocab} in {args.log}")
    window = calls[heads[0]:grads[-1] + 1]
    micro_steps = len(heads)
    wall = float(window[-1][7]) + float(window[-1][6]) - float(window[0][7])
    per_shape = defaultdict(float)
    for op, m, n, k, _alpha, beta, secs, _start in window:
        small = int(m) * int(n) * int(k) < args.small
        per_shape["small products" if small else f"{op} m={m} n={n} k={k} beta={beta}"] += float(secs)
    gemm = sum(per_shape.values())
    print(f"{micro_steps} micro-steps: {wall / micro_steps * 1e3:.1f} ms wall and "
          f"{gemm / micro_steps * 1e3:.1f} ms in sgemm_ per micro-step")
    for shape, secs in sorted(per_shape.items(), key=lambda kv: -kv[1]):
        print(f"  {shape}: {secs / micro_steps * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
