#!/opt/gradaccum/venv/bin/python
"""Where a training step's time goes, operator by operator: gradaccum against a Python peer.

--workload lm (default): bench/lm_throughput (the engine's Trainer) and bench/py/lm_throughput.py
(the peer's loop), both with --trace. --workload cnn: `gradaccum train` (the default Fashion-MNIST
CNN run at --split b x N, with profile_from_step) and bench/py/train_fmnist.py --trace. Each runs
under the profiler of its own side (libtorch's Kineto in C++, torch.profiler in Python: the same
RecordFunction events), and the script prints, per optimizer step, the self time of every
operator (its time minus that of the operators it calls) on both sides, the largest first, with
GEMMs and the rest summed. "outside any operator" is the traced steps' wall time that no operator
covers: the loop's own code (Python's interpreter, the engine's C++ between operators).

The profiler adds a cost to every operator call, so the totals are above an untraced run's; the
comparison holds for what each side spends where, not for the speed ratio (bench/compare_lm.py
measures that).

  bench/op_profile.py [--build build] [--workload lm|cnn] [--shape small|gpt2-124m] [--split 4x16]
      [--peer eager|compile|accelerate|fabric] [--threads 2] [--warmup-steps 2] [--steps 5] [--runs 1]
      [--top 25] [--keep DIR] [--gemm-shapes] [--engine-set K=V ...] [--peer-set K=V ...]

--gemm-shapes adds a table of every matmul shape (operands' sizes, N/T for row- or column-major)
with its time per step and rate on both sides: the GEMMs at the model's own shapes against the
rate bench/lm_throughput's probe reaches. --peer gradaccum --peer-set model.memory_format=contiguous
(--workload cnn) compares the engine with itself under another configuration.

With --runs R > 1 both programs run R times, alternating, and each number is the median over runs.
"""
import argparse
import collections
import json
import math
import os
import statistics
import subprocess
import sys
import shutil
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GEMMS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"}
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "


def trace_events(path):
    """The events of a Chrome trace."""
    with open(path) as f:
        return json.load(f)["traceEvents"]


def self_times(events, path):
    """{operator name: self time in µs} and the traced wall time (µs) of a Chrome trace's events."""
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    if not ops:
        sys.exit(f"op_profile: {path} has no CPU operator events")
    by_thread = collections.defaultdict(list)
    for e in ops:
        by_thread[e["tid"]].append(e)
    self_us = collections.Counter()
    covered = 0.0  # wall time under a top-level operator, on the thread that runs the loop
    main_tid = max(by_thread, key=lambda t: sum(e["dur"] for e in by_thread[t]))
    for tid, evs in by_thread.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [end, name, child time]
        for e in evs:
            start, end = e["ts"], e["ts"] + e["dur"]
            while stack and stack[-1][0] <= start:
                done = stack.pop()
                self_us[done[1]] += done[3] - done[2]
            if stack:
                stack[-1][2] += e["dur"]
            elif tid == main_tid:
                covered += e["dur"]
            stack.append([end, name_of(e["name"]), 0.0, e["dur"]])
        while stack:
            done = stack.pop()
            self_us[done[1]] += done[3] - done[2]
    first = min(e["ts"] for e in by_thread[main_tid])
    last = max(e["ts"] + e["dur"] for e in by_thread[main_tid])
    self_us["(outside any operator)"] += max(0.0, (last - first) - covered)
    return self_us, last - first


# Operators whose first input is the added term (addmm's bias), not a factor.
GEMMS_WITH_ADDEND = {"aten::addmm", "aten::_addmm_activation", "aten::baddbmm"}


def gemm_shapes(events):
    """{(operator, operand shapes with N/T for row-/column-major operands): [µs, FLOPs, calls]} of a
    trace recorded with input shapes (both sides' --trace do). A call's FLOPs are 2 × the first
    factor's elements × the second's columns: 2mkn for [m, k] @ [k, n], 2bmkn batched."""
    shapes = collections.defaultdict(lambda: [0.0, 0, 0])
    for e in events:
        if e.get("ph") != "X" or e.get("name") not in GEMMS:
            continue
        args = e.get("args", {})
        first = 1 if e["name"] in GEMMS_WITH_ADDEND else 0
        factors = (args.get("Input Dims") or [])[first:first + 2]
        strides = (args.get("Input Strides") or [[], [], []])[first:first + 2]
        if len(factors) != 2 or not factors[0] or not factors[1]:
            continue
        flops = 2 * math.prod(factors[0]) * factors[1][-1]
        operands = ["x".join(map(str, d)) + ("N" if not st or st[-1] == 1 else "T") for d, st in zip(factors, strides)]
        key = (e["name"].split("::")[-1], " @ ".join(operands))
        shapes[key][0] += e["dur"]
        shapes[key][1] += flops
        shapes[key][2] += 1
    return shapes


def name_of(raw):
    """Backward nodes as "backward: <node>" (MmBackward0, FusedQkvAttention), the rest as recorded."""
    node = raw[len(BACKWARD_PREFIX):] if raw.startswith(BACKWARD_PREFIX) else raw
    if node.startswith("torch::autograd::CppNode<"):  # a custom autograd::Function's backward
        return "backward: " + node[len("torch::autograd::CppNode<"):].rstrip(">").split("::")[-1]
    return "backward: " + node if node is not raw else raw


def run(command, trace):
    """Runs `command` with its trace written to `trace`; returns a one-line description."""
    if command[0] == "gradaccum-train":  # the program: the trace lands in its output_dir
        out_dir = trace + ".run"
        out = subprocess.run(command[1:] + ["--set", f"output_dir={out_dir}"], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"op_profile: {' '.join(command[1:])} failed:\n{out.stderr[-2000:]}")
        shutil.move(os.path.join(out_dir, "profiler", "trace-rank0.json"), trace)
        with open(os.path.join(out_dir, "summary.json")) as f:
            summary = json.load(f)
        shutil.rmtree(out_dir)
        return f"{summary['steps']} steps, final loss {summary['final_loss']:.4f}"
    out = subprocess.run(command + ["--trace", trace], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"op_profile: {' '.join(command)} failed:\n{out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "s_per_step" in result:
        return f"{result['s_per_step']:.4f} s/step traced, loss {result['first_loss']} -> {result['final_loss']}"
    return f"{result['steps']} steps, final loss {result['final_loss']:.4f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--workload", choices=["lm", "cnn"], default="lm")
    ap.add_argument("--shape", choices=["small", "gpt2-124m"], default="small", help="--workload lm")
    ap.add_argument("--split", default="4x16", help="--workload cnn: b x N of the global batch 64")
    ap.add_argument("--peer", choices=["eager", "compile", "accelerate", "fabric", "gradaccum"], default="eager",
                    help="gradaccum: the engine against itself, with --peer-set (--workload cnn)")
    ap.add_argument("--engine-set", action="append", default=[], metavar="KEY=VALUE",
                    help="--workload cnn: a config key for the engine run (repeatable)")
    ap.add_argument("--peer-set", action="append", default=[], metavar="KEY=VALUE",
                    help="--workload cnn, --peer gradaccum: a config key for the peer engine run (repeatable)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--keep", help="keep the traces in this directory")
    ap.add_argument("--gemm-shapes", action="store_true",
                    help="also print each matmul shape's time per step and GFLOP/s on both sides")
    args = ap.parse_args()
    if args.warmup_steps < 1 or args.steps < 1 or args.runs < 1:
        ap.error("--warmup-steps, --steps and --runs must be >= 1")
    if args.workload == "lm" and (args.peer == "gradaccum" or args.engine_set or args.peer_set):
        ap.error("--peer gradaccum, --engine-set and --peer-set need --workload cnn")
    if args.workload == "lm":
        common = ["--threads", str(args.threads), "--warmup-steps", str(args.warmup_steps), "--steps",
                  str(args.steps), "--shape", args.shape]
        engine = os.path.join(args.build, "bench", "lm_throughput")
        peer = [sys.executable, os.path.join(HERE, "py", "lm_throughput.py"), "--loop", args.peer] + common
        engine_command = [engine] + common
        what = f"GPT shape {args.shape}"
    else:
        b, n = (int(v) for v in args.split.split("x"))
        total = args.warmup_steps + args.steps
        engine = os.path.join(args.build, "gradaccum")
        engine_command = ["gradaccum-train", engine, "train", "--set", f"per_device_train_batch_size={b}",
                          "--set", f"gradient_accumulation_steps={n}", "--set", f"max_steps={total}",
                          "--set", "data.eval_limit=-1", "--set", f"threads={args.threads}",
                          "--set", f"profile_from_step={args.warmup_steps + 1}", "--set", f"profile_steps={args.steps}"]
        peer = [sys.executable, os.path.join(HERE, "py", "train_fmnist.py"), "--loop", args.peer, "--micro-batch",
                str(b), "--accum", str(n), "--max-steps", str(total), "--warmup-steps", str(args.warmup_steps),
                "--threads", str(args.threads)]
        if args.peer == "gradaccum":
            peer = engine_command + [a for kv in args.peer_set for a in ("--set", kv)]
        engine_command += [a for kv in args.engine_set for a in ("--set", kv)]
        what = f"CNN {b}x{n}"
    if not os.access(engine, os.X_OK):
        sys.exit(f"op_profile: {engine} is missing: build it (scripts/build.sh)")
    sys.path.insert(0, HERE)
    from cpu_kernels import match_cpu_kernels  # both sides on the CPU kernels gradaccum picks
    match_cpu_kernels(os.path.join(args.build, "gradaccum"))
    programs = {"gradaccum": engine_command, args.peer if args.peer != "gradaccum" else "gradaccum'": peer}
    directory = args.keep or tempfile.mkdtemp(prefix="op_profile-")
    os.makedirs(directory, exist_ok=True)
    per_run = {name: [] for name in programs}
    per_run_gemms = {name: [] for name in programs}
    for r in range(args.runs):
        order = list(programs) if r % 2 == 0 else list(reversed(programs))
        for name in order:
            trace = os.path.join(directory, f"{name}-{r}.json")
            described = run(programs[name], trace)
            events = trace_events(trace)
            ops, wall = self_times(events, trace)
            per_run[name].append((ops, wall, described))
            if args.gemm_shapes:
                per_run_gemms[name].append(gemm_shapes(events))
            print(f"run {r} {name}: {described}", flush=True)
            if not args.keep:
                os.remove(trace)
    if not args.keep:
        os.rmdir(directory)

    def per_step_ms(name, op):
        return statistics.median(ops.get(op, 0.0) for ops, _, _ in per_run[name]) / 1e3 / args.steps

    names = list(programs)
    every_op = set().union(*(ops.keys() for runs in per_run.values() for ops, _, _ in runs))
    rows = sorted(every_op, key=lambda op: -max(per_step_ms(n, op) for n in names))
    wall = {n: statistics.median(w for _, w, _ in per_run[n]) / 1e3 / args.steps for n in names}
    a, b = names
    print(f"\nms per optimizer step, self time ({what}, threads {args.threads}, {args.steps} traced "
          f"steps after {args.warmup_steps}, median of {args.runs} run(s)):")
    print(f"{'operator':<58} {a:>10} {b:>10} {'difference':>11}")
    for op in rows[:args.top]:
        x, y = per_step_ms(a, op), per_step_ms(b, op)
        print(f"{op[:58]:<58} {x:10.2f} {y:10.2f} {x - y:+11.2f}")
    rest = rows[args.top:]
    x = sum(per_step_ms(a, op) for op in rest)
    y = sum(per_step_ms(b, op) for op in rest)
    print(f"{f'the other {len(rest)} operators':<58} {x:10.2f} {y:10.2f} {x - y:+11.2f}")
    gx = sum(per_step_ms(a, op) for op in every_op if op in GEMMS)
    gy = sum(per_step_ms(b, op) for op in every_op if op in GEMMS)
    print(f"{'GEMMs (' + ', '.join(sorted(GEMMS)) + ')':<58}"[:58] + f" {gx:10.2f} {gy:10.2f} {gx - gy:+11.2f}")
    print(f"{'everything but GEMMs':<58} {wall[a] - gx:10.2f} {wall[b] - gy:10.2f} {wall[a] - gx - wall[b] + gy:+11.2f}")
    print(f"{'traced wall time':<58} {wall[a]:10.2f} {wall[b]:10.2f} {wall[a] - wall[b]:+11.2f}")
    if args.gemm_shapes:
        print_gemm_shapes(per_run_gemms, names, args.steps, args.top)


def print_gemm_shapes(per_run_gemms, names, steps, top):
    """Each matmul shape (N/T: an operand row- or column-major): ms per step and GFLOP/s per side,
    medians over runs; the rate is the shape's FLOPs over its calls' inclusive time."""
    def stat(name, key):
        runs = per_run_gemms[name]
        us = statistics.median(r.get(key, [0.0, 0, 0])[0] for r in runs)
        flops = statistics.median(r.get(key, [0.0, 0, 0])[1] for r in runs)
        return us / 1e3 / steps, (flops / (us * 1e3) if us > 0 else 0.0)

    keys = set().union(*(r.keys() for runs in per_run_gemms.values() for r in runs))
    keys = sorted(keys, key=lambda k: -max(stat(n, k)[0] for n in names))
    a, b = names
    print(f"\nmatmuls by shape, ms per optimizer step and GFLOP/s:")
    print(f"{'operator and operands':<58} {a:>10} {'GFLOP/s':>8} {b:>10} {'GFLOP/s':>8}")
    for key in keys[:top]:
        (ta, ra), (tb, rb) = stat(a, key), stat(b, key)
        print(f"{(key[0] + ' ' + key[1])[:58]:<58} {ta:10.2f} {ra:8.1f} {tb:10.2f} {rb:8.1f}")


if __name__ == "__main__":
    main()
