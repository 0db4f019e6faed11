#!/opt/gradaccum/venv/bin/python
"""gradaccum train vs the Python PyTorch loop on the default Fashion-MNIST CNN run.

For each decomposition b x N of the global batch 64, runs `gradaccum train` (the default
configuration, evaluation off) and bench/py/train_fmnist.py (the same loop in Python)
alternately, `--runs` processes each, every process under `flock` on the shared benchmark
lock, and prints the medians: samples/s after a warm-up (the same rule for both: the
samples of steps warmup+1..S over the time between the end of step `warmup` and the end
of step S), peak RSS (getrusage ru_maxrss) and the ratios gradaccum / Python.

Before timing anything it checks that the Python peer draws the same data order as the
engine (bench/window_order prints the engine's epoch permutations).

`--peers eager,compile,accelerate,fabric` adds the same loop under torch.compile, HF Accelerate
and Lightning Fabric (bench/py/train_fmnist.py --loop) as further programs in the rotation;
`eager:channels_last` is the eager loop in PyTorch's channels-last recipe. `--engine-formats
auto,contiguous` runs gradaccum in each model.memory_format (ratios against the first).

  /opt/gradaccum/venv/bin/python bench/compare_fmnist.py [--build build-bench] [--runs 5] [--max-steps 40]
      [--peers eager]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from cpu_kernels import match_cpu_kernels  # noqa: E402  (bench/cpu_kernels.py)
sys.path.insert(0, os.path.join(HERE, "py"))
import train_fmnist  # noqa: E402  (the Python peer: its permutation())

LOCK = "/tmp/gradaccum-bench.lock"


def check_data_order(build, n=60000, seed=42, epochs=2):
    """Compares the engine's epoch permutations with the Python peer's, element by element."""
    import torch
    out = subprocess.run([os.path.join(build, "bench", "window_order"), str(n), str(seed), str(epochs), "16"],
                         check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        ref = json.loads(line)
        perm = train_fmnist.permutation(n, seed, ref["epoch"])
        checksum = int((perm * torch.arange(n)).sum())
        ok = perm[:16].tolist() == ref["head"] and checksum == ref["checksum"]
        print(f"data order, epoch {ref['epoch']}: engine head {ref['head'][:6]}..., python head "
              f"{perm[:6].tolist()}..., checksums {ref['checksum']} / {checksum}: "
              f"{'identical' if ok else 'DIFFERENT'}")
        if not ok:
            sys.exit("the Python peer does not draw the engine's data order")


def warm_throughput(samples, ends, warmup):
    """Samples of steps warmup+1..S over the time from the end of step `warmup` to the end of step S."""
    t0 = ends[warmup - 1] if warmup > 0 else 0.0
    return sum(samples[warmup:]) / (ends[-1] - t0)


def child_usage(run):
    """Runs `run()` and adds the minor page faults and system CPU seconds of the processes it
    waited for (flock and the program under it) to its result: a heap trimmed every step shows
    up here as thousands of faults per step, whatever the load of the machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res["minor_faults"] = after.ru_minflt - before.ru_minflt
    res["sys_s"] = after.ru_stime - before.ru_stime
    return res


def run_engine(args, b, n, out_dir, extra=()):
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    cmd = ["flock", LOCK, os.path.join(args.build, "gradaccum"), "train",
           "--set", f"per_device_train_batch_size={b}", "--set", f"gradient_accumulation_steps={n}",
           "--set", f"max_steps={args.max_steps}", "--set", "data.eval_limit=-1",
           "--set", f"threads={args.threads}", "--set", f"output_dir={out_dir}", *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    steps = []
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if "samples_per_s" in record:  # training steps, not eval records
                steps.append(record)
    return {
        "samples_per_s": warm_throughput([s["samples"] for s in steps], [s["time_s"] for s in steps],
                                         args.warmup_steps),
        "samples_per_s_all": summary["samples_per_s"],
        "peak_rss_mb": summary["peak_rss_mb"],
        "first_loss": steps[0]["loss"], "final_loss": steps[-1]["loss"],
    }


def run_python(args, b, n, loop="eager", memory_format="contiguous"):
    cmd = ["flock", LOCK, sys.executable, os.path.join(HERE, "py", "train_fmnist.py"),
           "--micro-batch", str(b), "--accum", str(n), "--max-steps", str(args.max_steps),
           "--threads", str(args.threads), "--warmup-steps", str(args.warmup_steps), "--loop", loop,
           "--memory-format", memory_format]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build-bench"), help="CMake build directory")
    ap.add_argument("--splits", default="64x1,16x4,4x16,1x64", help="b x N decompositions")
    ap.add_argument("--runs", type=int, default=5, help="processes per program and split")
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write every run's figures to this file")
    ap.add_argument("--peers", default="eager", help="Python loops: eager, compile, accelerate, fabric; LOOP:channels_last "
                    "runs that loop in PyTorch's channels-last recipe")
    ap.add_argument("--engine-formats", default="auto", help="model.memory_format of the gradaccum runs (the first is "
                    "the one the ratios use): auto, channels_last, contiguous")
    args = ap.parse_args()
    # Both programs on the CPU kernels gradaccum would pick (bench/cpu_kernels.py).
    kernels = match_cpu_kernels(os.path.join(args.build, "gradaccum"))
    print(f"# CPU kernels for every process: {kernels}", file=sys.stderr, flush=True)
    args.build = os.path.abspath(args.build)

    check_data_order(args.build)
    splits = [tuple(int(v) for v in s.split("x")) for s in args.splits.split(",")]
    peers = ["python" if p == "eager" else "python-" + p for p in args.peers.split(",")]
    engines = ["gradaccum" if f == "auto" else "gradaccum:" + f for f in args.engine_formats.split(",")]
    programs = engines + peers
    results = {s: {p: [] for p in programs} for s in splits}
    work = tempfile.mkdtemp(prefix="gradaccum-bench-")
    for r in range(args.runs):
        for b, n in splits:
            # Rotate which program goes first, so drifts of the machine hit all alike.
            order = programs[r % len(programs):] + programs[:r % len(programs)]
            for program in order:
                if program.startswith("gradaccum"):
                    fmt = program.partition(":")[2] or "auto"
                    res = child_usage(lambda: run_engine(args, b, n, os.path.join(work, f"run-{b}x{n}-{r}"),
                                                         ("--set", f"model.memory_format={fmt}")))
                else:
                    loop, _, fmt = ("eager" if program == "python" else program[len("python-"):]).partition(":")
                    res = child_usage(lambda: run_python(args, b, n, loop or "eager", fmt or "contiguous"))
                results[(b, n)][program].append(res)
                print(f"run {r + 1}/{args.runs} {b}x{n} {program:22s}: {res['samples_per_s']:8.1f} samples/s, "
                      f"peak RSS {res['peak_rss_mb']:6.1f} MB, loss {res['first_loss']:.4f} -> "
                      f"{res['final_loss']:.4f}, {res['minor_faults']} minor faults, sys {res['sys_s']:.2f} s",
                      flush=True)
    shutil.rmtree(work, ignore_errors=True)

    med = statistics.median
    print(f"\nmedians over {args.runs} processes each; {args.max_steps} steps of 64 samples, throughput after "
          f"{args.warmup_steps} warm-up steps; threads {args.threads}")
    # One row per split and peer: samples/s, peak RSS and the ratios gradaccum / peer.
    print(f"ratios are {engines[0]} / peer")
    print("| b x N | peer | gradaccum samples/s | peer samples/s | ratio | gradaccum peak RSS MB "
          "| peer peak RSS MB | RSS ratio | gradaccum / peer minor faults (process) |")
    print("|" + "---|" * 9)
    rows = []
    for b, n in splits:
        e = results[(b, n)][engines[0]]
        es, er, ef = (med([x[k] for x in e]) for k in ("samples_per_s", "peak_rss_mb", "minor_faults"))
        for peer in engines[1:] + peers:
            p = results[(b, n)][peer]
            ps, pr, pf = (med([x[k] for x in p]) for k in ("samples_per_s", "peak_rss_mb", "minor_faults"))
            print(f"| {b} x {n} | {peer} | {es:.1f} | {ps:.1f} | {es / ps:.2f} | {er:.0f} | {pr:.0f} | {er / pr:.2f} "
                  f"| {ef:.0f} / {pf:.0f} |")
        rows.append({"micro_batch": b, "accum": n, **results[(b, n)]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
