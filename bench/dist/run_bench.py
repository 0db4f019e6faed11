#!/opt/gradaccum/venv/bin/python
"""Data parallel, deferred vs per-micro-step gradient synchronization: gradaccum against
Python DDP (bench/dist/py_ddp.py), W = 2 ranks, N accumulation steps, one thread per rank.

Links:
  lo      both ranks on this host's loopback (gradaccum: `train --nproc 2`; Python: two
          processes with MASTER_ADDR=127.0.0.1)
  RATE    e.g. 1gbit, 10gbit: rank 0 in network namespace ga0, rank 1 in ga1, joined by a
          veth pair shaped with tbf at RATE in both directions (bench/dist/netns.sh)
Modes: deferred (gradaccum's default / DDP with no_sync() on the first N-1 micro-steps) and
eager (sync_each_micro_step=true / DDP without no_sync()).
Implementations (--impls): ours (gradaccum), py (the DDP loop of py_ddp.py), accel (HF Accelerate's
accumulate() loop of py_ddp.py --mode accelerate, launched by torchrun; deferred mode, loopback only).

Runs alternate: each repetition goes through every link, and within a link through every
(implementation, mode), in an order rotated per repetition. Each run (both ranks) holds
/tmp/gradaccum-bench.lock. Reported: the median of step_time_s over all steps after the
warm-up of all repetitions, the range of the per-run medians, and bytes all-reduced per step.

  /opt/gradaccum/venv/bin/python bench/dist/run_bench.py --bin build-dist/gradaccum --reps 3

--sharding zero3: gradaccum with zero_stage 3 (deferred: sharded_grad_sync defer; eager:
each_micro_step) against PyTorch FSDP2 in py_ddp.py (deferred: --mode fsdp2_deferred, with
set_requires_gradient_sync(False) on the first N-1 micro-steps; eager: --mode fsdp2), in the
column that is otherwise DDP's.

Models: --model mlp (default) is the MLP on Fashion-MNIST above; --model gpt is the 3.3M-parameter
GPT-2 of issue 4 on random token ids (gradaccum: bench/dist/gpt-3m.yaml; Python: py_ddp.py
--model gpt), micro-batch 2 and N = 8 unless --micro-batch / --accum say otherwise:

  /opt/gradaccum/venv/bin/python bench/dist/run_bench.py --bin build-dist/gradaccum --model gpt --links lo --reps 3
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from cpu_kernels import match_cpu_kernels  # noqa: E402  (bench/cpu_kernels.py)

NETNS = os.path.join(HERE, "netns.sh")
PY_DDP = os.path.join(HERE, "py_ddp.py")
GPT_CONFIG = os.path.join(HERE, "gpt-3m.yaml")
LOCK = "/tmp/gradaccum-bench.lock"
NS = [("ga0", "ga-veth0"), ("ga1", "ga-veth1")]
MASTER_NETNS = "10.213.0.1"


def netns(*args):
    subprocess.run(["bash", NETNS, *args], check=True)


def our_args(a, mode, out_dir):
    if a.model == "gpt":
        # The model, data and optimizer are the config file's; the run's shape comes from here.
        sets = {
            "per_device_train_batch_size": a.micro_batch, "gradient_accumulation_steps": a.accum,
            "max_steps": a.max_steps, "threads": 1, "ddp_bucket_cap_mb": 25, "dist_timeout": 300,
            "sync_each_micro_step": "true" if mode == "eager" else "false",
            "output_dir": out_dir, "logging_steps": 1000,
        }
        if a.sharding == "zero3":
            sets["sync_each_micro_step"] = "false"
            sets["zero_stage"] = 3
            sets["sharded_grad_sync"] = "each_micro_step" if mode == "eager" else "defer"
        cmd = [a.bin, "train", GPT_CONFIG]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        return cmd
    hidden = "[" + ",".join(a.hidden.split(",")) + "]"
    sets = {
        "model.type": "mlp", "model.norm": "none", "model.hidden": hidden,
        "per_device_train_batch_size": a.micro_batch, "gradient_accumulation_steps": a.accum,
        "max_steps": a.max_steps, "threads": 1, "data.train_limit": a.train_limit,
        "data.eval_limit": -1, "ddp_bucket_cap_mb": 25, "dist_timeout": 300,
        "sync_each_micro_step": "true" if mode == "eager" else "false",
        "output_dir": out_dir, "logging_steps": 1000,
    }
    if a.sharding == "zero3":
        sets["sync_each_micro_step"] = "false"
        sets["zero_stage"] = 3
        sets["sharded_grad_sync"] = "each_micro_step" if mode == "eager" else "defer"
    cmd = [a.bin, "train"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


def py_args(a, mode, out_file):
    if a.sharding == "zero3" and mode in ("deferred", "eager"):
        mode = "fsdp2_deferred" if mode == "deferred" else "fsdp2"
    if a.model == "gpt":
        return ["/opt/gradaccum/venv/bin/python", PY_DDP, "--model", "gpt", "--micro-batch", str(a.micro_batch),
                "--accum", str(a.accum), "--max-steps", str(a.max_steps), "--mode", mode,
                "--threads", "1", "--bucket-cap-mb", "25", "--output", out_file]
    return ["/opt/gradaccum/venv/bin/python", PY_DDP, "--micro-batch", str(a.micro_batch), "--accum", str(a.accum),
            "--max-steps", str(a.max_steps), "--hidden", a.hidden, "--mode", mode,
            "--train-limit", str(a.train_limit), "--threads", "1", "--bucket-cap-mb", "25",
            "--output", out_file]


def sh_quote(args):
    return " ".join("'" + str(x).replace("'", "'\\''") + "'" for x in args)


def run_locked(script, timeout, log):
    """Runs a bash script under the benchmark lock, in its own process group."""
    # The timeout starts once the lock is held: waiting for other benchmarks is not a hang.
    cmd = ["flock", LOCK, "timeout", "-k", "10", str(int(timeout)), "bash", "-c", script]
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return p.wait()
        except BaseException:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise


def launch(a, impl, mode, link, port, run_dir):
    os.makedirs(run_dir, exist_ok=True)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    log = os.path.join(run_dir, "log.txt")
    if link == "lo":
        base = f"export GLOO_SOCKET_IFNAME=lo MASTER_ADDR=127.0.0.1 MASTER_PORT={port}; "
        if impl == "ours":
            script = base + sh_quote(our_args(a, mode, run_dir) + ["--nproc", "2"])
        elif impl == "accel":
            args = py_args(a, "accelerate", metrics)
            torchrun = ["/opt/gradaccum/venv/bin/torchrun", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                        "--master-port", str(port)]
            # Rank 0 writes --output; the other rank's file is not read.
            script = base + sh_quote(torchrun + args[1:])
        else:
            ranks = [f"RANK={r} LOCAL_RANK={r} WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 " +
                     sh_quote(py_args(a, mode, metrics if r == 0 else "")) for r in range(2)]
            script = base + f"{ranks[0]} & p0=$!; {ranks[1]} & p1=$!; " \
                            "wait $p0; r0=$?; wait $p1; r1=$?; exit $((r0|r1))"
    else:
        parts = []
        for r, (ns, dev) in enumerate(NS):
            cmd = our_args(a, mode, run_dir) if impl == "ours" \
                else py_args(a, mode, metrics if r == 0 else "")
            env = (f"RANK={r} LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 MASTER_ADDR={MASTER_NETNS} "
                   f"MASTER_PORT={port} GLOO_SOCKET_IFNAME={dev}")
            parts.append(f"ip netns exec {ns} env {env} {sh_quote(cmd)}")
        script = f"{parts[0]} & p0=$!; {parts[1]} & p1=$!; wait $p0; r0=$?; wait $p1; r1=$?; exit $((r0|r1))"
    t0 = time.time()
    rc = run_locked(script, a.timeout, log)
    wall = time.time() - t0
    if rc != 0:
        tail = open(log).read()[-1500:]
        print(f"  FAILED rc={rc} ({impl} {mode} {link}); log {log}:\n{tail}", flush=True)
        return None
    steps = [json.loads(l) for l in open(metrics) if '"step_time_s"' in l]
    return {"steps": steps, "wall_s": wall}


def link_check(rate, size_mb=200):
    """Measures the shaped link: rank-1 namespace sends size_mb MB to the rank-0 namespace."""
    recv = ("import socket,time;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
            "s.bind(('10.213.0.1',29599));s.listen(1);c,_=s.accept();n=0;t=None\n"
            "while True:\n d=c.recv(1<<20)\n if not d: break\n t=t or time.time();n+=len(d)\n"
            "print(n*8/(time.time()-t)/1e9)")
    send = (f"import socket,time;time.sleep(0.5);s=socket.create_connection(('10.213.0.1',29599));"
            f"b=bytes(1<<20)\nfor _ in range({size_mb}): s.sendall(b)\ns.close()")
    r = subprocess.Popen(["ip", "netns", "exec", "ga0", "/opt/gradaccum/venv/bin/python", "-c", recv],
                         stdout=subprocess.PIPE, text=True)
    subprocess.run(["ip", "netns", "exec", "ga1", "/opt/gradaccum/venv/bin/python", "-c", send], check=True)
    out, _ = r.communicate(timeout=120)
    return float(out.strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the gradaccum program")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--links", default="lo,10gbit,1gbit")
    ap.add_argument("--impls", default="ours,py")
    ap.add_argument("--modes", default="deferred,eager")
    ap.add_argument("--sharding", choices=["none", "zero3"], default="none",
                    help="zero3: gradaccum's zero_stage 3 against PyTorch FSDP2")
    ap.add_argument("--model", choices=["mlp", "gpt"], default="mlp",
                    help="mlp: the Fashion-MNIST MLP; gpt: the 3.3M-parameter GPT-2 on random tokens")
    ap.add_argument("--hidden", default="2048,2048,2048", help="--model mlp: hidden widths")
    ap.add_argument("--micro-batch", type=int, default=None, help="default 16 (mlp) or 2 (gpt)")
    ap.add_argument("--accum", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of each run")
    ap.add_argument("--train-limit", type=int, default=4096)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--work", default="/tmp/ga-dist-bench")
    ap.add_argument("--results", default="", help="write all per-run results here (JSON)")
    a = ap.parse_args()
    a.bin = os.path.abspath(a.bin)
    # Both implementations on the CPU kernels gradaccum would pick (bench/cpu_kernels.py).
    print(f"CPU kernels for every rank: {match_cpu_kernels(a.bin)}", flush=True)
    if a.micro_batch is None:
        a.micro_batch = 2 if a.model == "gpt" else 16
    # A SIGTERM or SIGHUP still runs the `finally` below, which removes the namespaces.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(1))

    links = a.links.split(",")
    # Accelerate's accumulate() always defers: it has no eager mode to compare.
    combos = [(i, m) for i in a.impls.split(",") for m in a.modes.split(",") if not (i == "accel" and m != "deferred")]
    results = {}  # (link, impl, mode) -> list of runs
    link_rates = {}
    port = 29700 + (os.getpid() % 100) * 10
    try:
        for rep in range(a.reps):
            for link in links:
                if link != "lo":
                    netns("up", link)
                    if link not in link_rates:
                        link_rates[link] = link_check(link)
                        print(f"link {link}: measured {link_rates[link]:.2f} Gbit/s (one TCP stream)", flush=True)
                k = rep % len(combos)
                for impl, mode in combos[k:] + combos[:k]:
                    if impl == "accel" and link != "lo":
                        continue  # torchrun on one host: loopback only
                    port += 1
                    run_dir = os.path.join(a.work, f"{link}-{impl}-{mode}-{rep}")
                    r = launch(a, impl, mode, link, port, run_dir)
                    if r is None:
                        continue
                    times = [s["step_time_s"] for s in r["steps"][a.warmup:]]
                    r["median_s"] = statistics.median(times)
                    results.setdefault((link, impl, mode), []).append(r)
                    print(f"rep {rep} {link:7s} {impl:4s} {mode:8s} median {r['median_s']:.3f} s/step "
                          f"({len(times)} steps, run {r['wall_s']:.0f} s)", flush=True)
    finally:
        if any(l != "lo" for l in links):
            netns("down")

    if a.results:
        with open(a.results, "w") as f:
            json.dump({f"{k[0]}|{k[1]}|{k[2]}": v for k, v in results.items()}, f)

    def stat(link, impl, mode):
        runs = results.get((link, impl, mode))
        if not runs:
            return None
        times = [s["step_time_s"] for r in runs for s in r["steps"][a.warmup:]]
        mb = statistics.median(s.get("allreduce_bytes", s.get("reduce_scatter_bytes", 0)) for r in runs for s in r["steps"]) / 1e6
        per_run = [r["median_s"] for r in runs]
        return {"median": statistics.median(times), "lo": min(per_run), "hi": max(per_run),
                "mb": mb, "runs": len(runs)}

    f3 = lambda x: f"{x:.3f}"
    print()
    model = ("GPT-2 3.38M parameters (bench/dist/gpt-3m.yaml), 128 tokens per row" if a.model == "gpt"
             else f"MLP 784-{a.hidden.replace(',', '-')}-10")
    print(f"W = 2, N = {a.accum}, micro-batch {a.micro_batch}, {model}, "
          f"1 thread per rank; median over steps {a.warmup + 1}..{a.max_steps} of all runs "
          f"[range of per-run medians]; MB = 10^6 bytes")
    print()
    peer = "FSDP2" if a.sharding == "zero3" else "DDP"
    print(f"| link | mode | gradaccum s/step | Python {peer} s/step | gradaccum / {peer} | Accelerate (torchrun) s/step | "
          "gradaccum / Accelerate | MB all-reduced / step | runs |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for link in links:
        for mode in a.modes.split(","):
            o, p, acc = stat(link, "ours", mode), stat(link, "py", mode), stat(link, "accel", mode)
            cell = lambda s: f"{f3(s['median'])} [{f3(s['lo'])}–{f3(s['hi'])}]" if s else "–"
            ratio = f"{o['median'] / p['median']:.2f}" if o and p else "–"
            acc_ratio = f"{o['median'] / acc['median']:.2f}" if o and acc else "–"
            mb = f"{o['mb']:.1f}" if o else (f"{p['mb']:.1f}" if p else "–")
            runs = " + ".join(str(s["runs"] if s else 0) for s in (o, p, acc))
            label = "deferred (no_sync)" if mode == "deferred" else "every micro-step"
            print(f"| {link} | {label} | {cell(o)} | {cell(p)} | {ratio} | {cell(acc)} | {acc_ratio} | {mb} | {runs} |")
    print()
    print("| link | eager / deferred, gradaccum | eager / deferred, Python DDP |")
    print("| --- | --- | --- |")
    for link in links:
        cells = []
        for impl in ("ours", "py"):
            d, e = stat(link, impl, "deferred"), stat(link, impl, "eager")
            cells.append(f"{e['median'] / d['median']:.2f}x" if d and e else "–")
        print(f"| {link} | {cells[0]} | {cells[1]} |")
    if link_rates:
        print()
        print("Measured shaped links (one TCP stream, 200 MB): " +
              ", ".join(f"{k}: {v:.2f} Gbit/s" for k, v in link_rates.items()))


if __name__ == "__main__":
    main()
