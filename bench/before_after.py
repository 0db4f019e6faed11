#!/opt/gradaccum/venv/bin/python
"""The engine against an earlier build of itself: GPT 3.4M (bench/lm_throughput, tokens/s) and the
Fashion-MNIST CNN (`gradaccum train`, samples/s after the warm-up) from two build directories,
alternating processes (the order flips every round), each started on a quiet machine
(compare_lm.wait_for_quiet), medians over `--runs` processes. A refactoring that keeps the
behaviour should show ratios within the noise.

  /opt/gradaccum/venv/bin/python bench/before_after.py --before ../wt-before/build --after build
      [--runs 3] [--splits 16x4,4x16] [--max-steps 40] [--threads 2] [--max-wait 120]
"""
import argparse
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare_fmnist  # noqa: E402
import compare_lm  # noqa: E402
import lm_runs  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--splits", default="16x4,4x16")
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-load", type=float, default=1.5)
    ap.add_argument("--max-busy", type=float, default=0.3)
    ap.add_argument("--max-wait", type=float, default=120)
    args = ap.parse_args()
    builds = {"before": args.before, "after": args.after}
    splits = [tuple(int(x) for x in s.split("x")) for s in args.splits.split(",")]
    rates = {}  # (bench, build) -> [rates]
    scratch = tempfile.mkdtemp(prefix="gradaccum-before-after-")
    for r in range(args.runs):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for name in order:
            compare_lm.wait_for_quiet(args.max_load, args.max_busy, args.max_wait)
            lm = lm_runs.run(builds[name], ["--threads", str(args.threads)])
            rates.setdefault(("GPT 3.4M tokens/s", name), []).append(lm["tokens_per_s"])
        for b, n in splits:
            for name in order:
                compare_lm.wait_for_quiet(args.max_load, args.max_busy, args.max_wait)
                run_args = argparse.Namespace(build=builds[name], max_steps=args.max_steps, threads=args.threads,
                                              warmup_steps=args.warmup_steps)
                res = compare_fmnist.run_engine(run_args, b, n, os.path.join(scratch, f"{name}-{b}x{n}"))
                print(f"cnn {b}x{n} {name}: {res['samples_per_s']:.1f} samples/s", flush=True)
                rates.setdefault((f"CNN {b}x{n} samples/s", name), []).append(res["samples_per_s"])
    print("\n| benchmark | before | after | after / before |\n| --- | --- | --- | --- |")
    for bench in dict.fromkeys(k[0] for k in rates):
        before = statistics.median(rates[(bench, "before")])
        after = statistics.median(rates[(bench, "after")])
        print(f"| {bench} | {before:.1f} | {after:.1f} | {after / before:.3f} |")


if __name__ == "__main__":
    main()
