#!/opt/gradaccum/venv/bin/python
"""Language-model throughput: gradaccum (bench/lm_throughput) vs the Python loops (bench/py/lm_throughput.py).

The peers (`--peers`, default eager): the plain PyTorch eager loop, the same under torch.compile,
HF Accelerate's accumulate() loop and Lightning Fabric's no_backward_sync loop, all on the same
torch, model, initial weights (drawn identically in every program; the first window's loss
shows it), data order, b x N and threads. `--shape gpt2-124m` runs GPT-2 small's shape at 2 x 8,
`--shape gpt2-124m-1024` at context 1024, 8 x 4. `--device cuda` runs both on the first CUDA device
(a build configured with -DGRADACCUM_WITH_CUDA=ON) and adds their peak device memory.

Runs `--runs` processes of each program in turn (the order rotates per round).
The driver takes the shared benchmark lock (/tmp/gradaccum-bench.lock, the lock `flock`
uses) once and holds it for the whole comparison (other users queue many short locked runs;
released between processes, the comparison would interleave with them for hours). Before
each process it waits until the machine is quiet: the 1-minute
load average below `--max-load` AND the other processes' CPU use, sampled over 3 s from
/proc/stat while nothing of ours runs, below `--max-busy` cores. (The load average alone
lags: our own previous process keeps it near 2 for a minute.) After `--max-wait` seconds it
runs anyway and marks the process "quiet": false. Prints every process's JSON line and a
Markdown table of medians and [min–max] ranges over processes.

`--mixed-precision bf16` passes the same flag to both programs (forward and loss under bfloat16
autocast, GEMM peak measured in bfloat16).

  /opt/gradaccum/venv/bin/python bench/compare_lm.py [--build build-bench] [--runs 3] [--threads 2]
      [--steps 10] [--warmup-steps 2] [--mixed-precision no|bf16] [--max-load 1.5] [--max-busy 0.3]
      [--max-wait 900] [--profile-runs 1] [--peers eager,compile,accelerate,fabric]
      [--shape small|gpt2-124m|gpt2-124m-1024] [--device cpu|cuda] [--peers-own-mkl]

--max-wait 0 runs each process at once, without sampling the machine's load (a lent GPU
machine of one's own).
"""
import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from cpu_kernels import match_cpu_kernels  # noqa: E402  (bench/cpu_kernels.py)

LOCK = "/tmp/gradaccum-bench.lock"


def cpu_busy_cores(seconds=3.0):
    """Cores in use (all processes) over `seconds`, from /proc/stat's aggregate line."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + v[4]  # idle + iowait
        return sum(v), idle
    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return (os.cpu_count() or 1) * (1.0 - (i1 - i0) / max(1, t1 - t0))


def wait_for_quiet(max_load, max_busy, max_wait):
    if max_wait <= 0:
        return True, os.getloadavg()[0], 0.0, 0.0
    start = time.time()
    while True:
        load = os.getloadavg()[0]
        busy = cpu_busy_cores()
        if load < max_load and busy < max_busy:
            return True, load, busy, time.time() - start
        if time.time() - start > max_wait:
            return False, load, busy, time.time() - start
        time.sleep(7)


def run(cmd, args):
    """One process of `cmd` once the machine is quiet (the caller holds the lock)."""
    quiet, load, busy, waited = wait_for_quiet(args.max_load, args.max_busy, args.max_wait)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    load_after = os.getloadavg()[0]
    res = json.loads(out.strip().splitlines()[-1])
    res.update(quiet=quiet, load_before=round(load, 2), busy_cores_before=round(busy, 2),
               waited_s=round(waited), load_after=round(load_after, 2))
    return res


def spread(values, fmt="{:.1f}"):
    return (fmt + " [" + fmt + "–" + fmt + "]").format(statistics.median(values), min(values), max(values))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build-bench"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--mixed-precision", choices=["no", "bf16"], default="no",
                    help="bf16: forward and loss under bfloat16 autocast in both programs")
    ap.add_argument("--max-load", type=float, default=1.5)
    ap.add_argument("--max-busy", type=float, default=0.3)
    ap.add_argument("--max-wait", type=float, default=900)
    ap.add_argument("--peers", default="eager",
                    help="comma-separated Python loops: eager, compile, accelerate, fabric")
    ap.add_argument("--shape", choices=["small", "gpt2-124m", "gpt2-124m-1024"], default="small")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--peers-own-mkl", action="store_true",
                    help="leave the peers MKL's own code where gradaccum runs MKL's Intel code path on another "
                         "vendor's CPU (by default they run the same: bench/cpu_kernels.py)")
    ap.add_argument("--profile-runs", type=int, default=1,
                    help="then this many processes of lm_throughput --profile (the Trainer's loop "
                         "written out with timers around forward, backward and the step)")
    args = ap.parse_args()
    # Both programs on the CPU kernels gradaccum would pick (bench/cpu_kernels.py).
    kernels = match_cpu_kernels(os.path.join(args.build, "gradaccum"), own_mkl_path=args.peers_own_mkl)
    print(f"# CPU kernels for every process: {kernels}", file=sys.stderr, flush=True)
    common = ["--threads", str(args.threads), "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps),
              "--mixed-precision", args.mixed_precision, "--shape", args.shape, "--device", args.device]
    engine = [os.path.join(args.build, "bench", "lm_throughput")] + common
    programs = {"gradaccum": engine}
    for peer in args.peers.split(","):
        programs["python-" + peer] = [sys.executable, os.path.join(HERE, "py", "lm_throughput.py"), "--loop", peer] + common
    results = {name: [] for name in programs}
    lock = open(LOCK, "a")
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the driver exits
    for r in range(args.runs):
        names = list(programs)[r % len(programs):] + list(programs)[:r % len(programs)]
        for name in names:
            res = run(programs[name], args)
            results[name].append(res)
            print(json.dumps(res), flush=True)
            print(f"# run {r + 1}/{args.runs} {name}: {res['tokens_per_s']:.0f} tokens/s, "
                  f"{res['fraction_of_gemm_model']:.2f} of GEMM, quiet={res['quiet']}", file=sys.stderr,
                  flush=True)

    profiles = []
    for r in range(args.profile_runs):
        profiles.append(run(engine + ["--profile"], args))
        print(json.dumps(profiles[-1]), flush=True)

    precision = "bf16 (bfloat16 autocast; GEMM peak in bfloat16)" if args.mixed_precision == "bf16" \
        else "fp32"
    print(f"\n{precision}: medians [min–max] over processes; threads {args.threads}, {args.steps} timed optimizer "
          f"steps after {args.warmup_steps} warm-up steps per process")
    rows = [("processes (quiet)", lambda v: f"{len(v)} ({sum(x['quiet'] for x in v)})"),
            ("mixed precision / GEMM dtype", lambda v: f"{v[0]['mixed_precision']} / {v[0]['gemm_dtype']}"),
            ("tokens/s", lambda v: spread([x["tokens_per_s"] for x in v], "{:.0f}")),
            ("s per optimizer step", lambda v: spread([x["s_per_step"] for x in v], "{:.3f}")),
            ("model GFLOP/s", lambda v: spread([x["model_gflops"] for x in v], "{:.2f}")),
            ("GEMM GFLOP/s, model shapes", lambda v: spread([x["gemm_model_gflops"] for x in v], "{:.2f}")),
            ("GEMM GFLOP/s, 2048³", lambda v: spread([x["gemm_square_gflops"] for x in v], "{:.2f}")),
            ("model FLOP/s / GEMM (model shapes)",
             lambda v: spread([x["fraction_of_gemm_model"] for x in v], "{:.3f}")),
            ("model FLOP/s / GEMM (2048³)",
             lambda v: spread([x["fraction_of_gemm_square"] for x in v], "{:.3f}")),
            ("peak RSS MB", lambda v: spread([x["peak_rss_mb"] for x in v], "{:.0f}")),
            ("device / peak device MB", lambda v: f"{v[0].get('device', 'cpu')} / " +
                                                  spread([x.get("peak_device_mb", 0.0) for x in v], "{:.0f}")),
            ("first / last window loss", lambda v: f"{statistics.median(x['first_loss'] for x in v):.4f} / "
                                                   f"{statistics.median(x['final_loss'] for x in v):.4f}")]
    print("| | " + " | ".join(programs) + " |")
    print("|---" * (len(programs) + 1) + "|")
    for label, cell in rows:
        print(f"| {label} | " + " | ".join(cell(results[n]) for n in programs) + " |")
    e = statistics.median(x["tokens_per_s"] for x in results["gradaccum"])
    e_rss = statistics.median(x["peak_rss_mb"] for x in results["gradaccum"])
    print()
    for name in list(programs)[1:]:
        p = statistics.median(x["tokens_per_s"] for x in results[name])
        p_rss = statistics.median(x["peak_rss_mb"] for x in results[name])
        line = f"gradaccum / {name}: tokens/s {e / p:.3f}, peak RSS {e_rss / p_rss:.3f}"
        if args.device == "cuda":
            e_dev = statistics.median(x["peak_device_mb"] for x in results["gradaccum"])
            p_dev = statistics.median(x["peak_device_mb"] for x in results[name])
            line += f", peak device memory {e_dev / p_dev:.3f}"
        print(line + " (medians)")
    print("\nseconds per optimizer step (medians; engine: lm_throughput --profile):")
    for name, runs in [("gradaccum-profile", profiles)] + [(n, results[n]) for n in list(programs)[1:]]:
        if runs:
            keys = runs[0]["profile_s_per_step"].keys()
            print(f"  {name}: " + ", ".join(
                f"{k} {statistics.median(x['profile_s_per_step'][k] for x in runs):.3f}" for k in keys))


if __name__ == "__main__":
    main()
