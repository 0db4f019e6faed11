#!/opt/gradaccum/venv/bin/python
"""Seed 000's MLP micro-step benchmark: gradaccum vs the same loop on raw libtorch vs Python.

Alternates `--runs` processes of bench/mlp_microstep (the engine on models::GeluMlp, the fused
network), bench/mlp_microstep --unfused (the engine on the Sequential of libtorch layers),
bench/mlp_microstep --raw (the loop written directly against libtorch's layers, no engine) and
bench/py/mlp_microstep.py (the Python loop), each under `flock` on the shared benchmark lock, and prints the medians over
processes of each process's median microseconds per micro-step.

  /opt/gradaccum/venv/bin/python bench/compare_mlp.py [--build build-bench] [--runs 5] [--threads 1]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from cpu_kernels import match_cpu_kernels  # noqa: E402  (bench/cpu_kernels.py)

LOCK = "/tmp/gradaccum-bench.lock"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build-bench"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    # Both programs on the CPU kernels gradaccum would pick (bench/cpu_kernels.py).
    kernels = match_cpu_kernels(os.path.join(args.build, "gradaccum"))
    print(f"# CPU kernels for every process: {kernels}", file=sys.stderr, flush=True)
    common = ["--threads", str(args.threads)]
    programs = {
        "gradaccum": [os.path.join(args.build, "bench", "mlp_microstep")] + common,
        "gradaccum-unfused": [os.path.join(args.build, "bench", "mlp_microstep"), "--unfused"] + common,
        "libtorch-raw": [os.path.join(args.build, "bench", "mlp_microstep"), "--raw"] + common,
        "python": [sys.executable, os.path.join(HERE, "py", "mlp_microstep.py")] + common,
    }
    results = {name: [] for name in programs}
    for r in range(args.runs):
        names = list(programs) if r % 2 == 0 else list(reversed(programs))
        for name in names:
            out = subprocess.run(["flock", LOCK] + programs[name], check=True, capture_output=True,
                                 text=True).stdout
            res = json.loads(out.strip().splitlines()[-1])
            results[name].append(res)
            print(f"run {r + 1}/{args.runs} {name:12s}: {res['us_per_micro_step']:7.1f} us/micro-step "
                  f"(blocks {res['repeats_us']})", flush=True)
    print(f"\nmedians over {args.runs} processes (each: median of 7 blocks of 50 optimizer steps x 16 "
          f"micro-steps, after 20 warm-up steps); threads {args.threads}")
    print("| program | us per micro-step (median) | min over processes | vs Python |")
    print("|---|---|---|---|")
    py = statistics.median(x["us_per_micro_step"] for x in results["python"])
    for name, runs in results.items():
        med = statistics.median(x["us_per_micro_step"] for x in runs)
        low = min(x["us_per_micro_step"] for x in runs)
        print(f"| {name} | {med:.1f} | {low:.1f} | {med / py:.2f} |")


if __name__ == "__main__":
    main()
