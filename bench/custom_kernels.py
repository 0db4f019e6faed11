#!/opt/gradaccum/venv/bin/python
"""What each hand-written kernel buys end to end: the engine with all of them, with none, and
with all but one, on the benchmark each kernel serves (kernels/custom_kernels.h).

  lm   bench/lm_throughput (GPT-2 of 3.4M parameters, 8 x 4 micro-steps, fp32): tokens/s;
       with --shape gpt2-124m GPT-2 small's shape at 2 x 8 (2 steps after 1, ~3.5 min a process)
  mlp  bench/mlp_microstep (seed 000's MLP, 1 x 16, 1 thread): us per micro-step
  cnn  `gradaccum train`, the default Fashion-MNIST CNN at 64x1 and 16x4 (`--splits`): samples/s,
       and each process's fastest optimizer step after the warm-up

Every variant runs `--runs` processes; the variants alternate round-robin (the order rotates
per round), each process under `flock /tmp/gradaccum-bench.lock` after the machine is quiet
(bench/compare_lm.py's rule, at most `--max-wait` seconds). Prints every process's result and a
Markdown table: the median [min-max] per variant, and for each kernel its end-to-end win
(all / all-but-it - 1 for rates, the inverse for times). A kernel stays only where that win is
at least 5% (the rule of BENCHMARKS.md).

  /opt/gradaccum/venv/bin/python bench/custom_kernels.py --bench lm|mlp|cnn [--build build] [--runs 3] [--splits 64x1,16x4]
      [--shape small|gpt2-124m] [--only KERNEL,...]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from compare_lm import wait_for_quiet  # noqa: E402
from compare_fmnist import run_engine  # noqa: E402

LOCK = "/tmp/gradaccum-bench.lock"

# The kernels each benchmark exercises (the others do not run there).
SERVED = {
    "lm": ["qkv_attention", "gelu_tanh", "softmax_cross_entropy", "heap_retention", "mkl_intel_path"],
    "mlp": ["gelu_mlp", "heap_retention", "mkl_intel_path"],
    "cnn": ["group_norm", "heap_retention", "mkl_intel_path"],
}
ALL = ["qkv_attention", "gelu_tanh", "softmax_cross_entropy", "gelu_mlp", "heap_retention", "group_norm",
       "mkl_intel_path"]


def variants(bench, only=()):
    out = {"all": "all"} if only else {"all": "all", "none": "none"}
    for k in SERVED[bench]:
        if only and k not in only:
            continue
        out[f"all but {k}"] = ",".join(x for x in ALL if x != k)
    return out


def run_lm(args, spec):
    steps = ["--steps", "10", "--warmup-steps", "2"] if args.shape == "small" else ["--steps", "2", "--warmup-steps", "1"]
    cmd = ["flock", LOCK, os.path.join(args.build, "bench", "lm_throughput"), "--threads", "2", "--shape", args.shape,
           *steps, "--custom-kernels", spec]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    # The fastest step of the process: this machine's noise (other tenants) only ever slows
    # a step down, so the minimum separates kernels that a 20% spread of medians hides.
    return {"value": r["tokens_per_s"], "best": r["s_per_step_min"], "peak_rss_mb": r["peak_rss_mb"],
            "final_loss": r["final_loss"]}


def run_mlp(args, spec):
    cmd = ["flock", LOCK, os.path.join(args.build, "bench", "mlp_microstep"), "--threads", "1",
           "--custom-kernels", spec]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return {"value": r["us_per_micro_step"], "best": r["us_per_micro_step_min"],
            "peak_rss_mb": r["peak_rss_mb"], "final_loss": r["final_loss"]}


def run_cnn(args, spec, split, work):
    b, n = split
    engine_args = types.SimpleNamespace(build=args.build, max_steps=40, threads=2, warmup_steps=5)
    out_dir = os.path.join(work, "run")
    r = run_engine(engine_args, b, n, out_dir, extra=["--set", f"custom_kernels={spec}"])
    # The fastest warm step, as for lm: other tenants only ever slow a step down.
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        steps = [json.loads(line) for line in f]
    step_times = [s["step_time_s"] for s in steps if "step_time_s" in s][engine_args.warmup_steps:]
    return {"value": r["samples_per_s"], "best": min(step_times), "peak_rss_mb": r["peak_rss_mb"],
            "final_loss": r["final_loss"]}


def spread(values, fmt="{:.1f}"):
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", choices=sorted(SERVED), required=True)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-wait", type=float, default=30)
    ap.add_argument("--splits", default="64x1,16x4", help="cnn: b x N decompositions")
    ap.add_argument("--shape", choices=["small", "gpt2-124m"], default="small", help="lm: the model's shape")
    ap.add_argument("--only", default="", help="comma-separated kernels: only their all-but-one variants (and all)")
    args = ap.parse_args()

    only = [k for k in args.only.split(",") if k]
    unknown = [k for k in only if k not in SERVED[args.bench]]
    if unknown:
        ap.error(f"--only: {', '.join(unknown)} not among the kernels --bench {args.bench} serves: "
                 f"{', '.join(SERVED[args.bench])}")
    cases = variants(args.bench, only)
    splits = [tuple(int(v) for v in s.split("x")) for s in args.splits.split(",")] if args.bench == "cnn" else [None]
    higher_is_better = args.bench != "mlp"
    unit = {"lm": "tokens/s", "mlp": "us per micro-step", "cnn": "samples/s"}[args.bench]
    work = tempfile.mkdtemp(prefix="gradaccum-kernels-")
    results = {(s, v): [] for s in splits for v in cases}
    names = list(cases)
    for r in range(args.runs):
        order = names[r % len(names):] + names[:r % len(names)]
        for split in splits:
            for name in order:
                quiet = wait_for_quiet(1.5, 0.3, args.max_wait)[0]
                if args.bench == "lm":
                    res = run_lm(args, cases[name])
                elif args.bench == "mlp":
                    res = run_mlp(args, cases[name])
                else:
                    res = run_cnn(args, cases[name], split, work)
                res.update({"variant": name, "split": split, "round": r, "quiet": quiet})
                print(json.dumps(res), flush=True)
                results[(split, name)].append(res)

    best_unit = {"lm": "fastest step s", "mlp": "fastest block us", "cnn": "fastest step s"}[args.bench]
    print(f"\n| {'b x N | ' if args.bench == 'cnn' else ''}variant | {unit} | {best_unit + ' | ' if best_unit else ''}"
          "peak RSS MB | the kernel's end-to-end win |")
    print(f"|{'---|' if args.bench == 'cnn' else ''}---|---|{'---|' if best_unit else ''}---|---|")
    for split in splits:
        base = statistics.median(x["value"] for x in results[(split, "all")])
        has_best = "best" in results[(split, "all")][0]
        base_best = statistics.median(x["best"] for x in results[(split, "all")]) if has_best else None
        for name in names:
            rs = results[(split, name)]
            value = statistics.median(x["value"] for x in rs)
            win = ""
            if name != "all":
                ratio = base / value if higher_is_better else value / base
                win = f"{(ratio - 1) * 100:+.1f}%"
                if has_best:  # times: a kernel wins when all's fastest step is shorter
                    best = statistics.median(x["best"] for x in rs)
                    win += f" (fastest: {(best / base_best - 1) * 100:+.1f}%)"
                if name == "none":
                    win = "all together: " + win
            prefix = f"{split[0]}x{split[1]} | " if split else ""
            best_col = f"{spread([x['best'] for x in rs], '{:.4g}')} | " if has_best else ""
            print(f"| {prefix}{name} | {spread([x['value'] for x in rs])} | {best_col}"
                  f"{spread([x['peak_rss_mb'] for x in rs])} | {win} |")


if __name__ == "__main__":
    main()
