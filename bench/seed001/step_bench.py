"""What bench/seed001's step benchmarks (bloom560m.py, smollm2.py) share: the gradaccum run read back
from its metrics.jsonl, the Python peers' accumulation loop, and one process's result line.

Every result is a dict: program, precision, steps, s_per_step (the median over the optimizer steps
after the first, which pays for first-touch allocation and, under torch.compile, compilation),
step_times, losses (each window's mean micro-batch loss) and peak_rss_mb (the process's peak
resident set, MB = 2^20 bytes as the engine's peak_rss_mb).
"""
import contextlib
import json
import os
import resource
import statistics
import subprocess
import time


def median_after_first(times):
    return statistics.median(times[1:] if len(times) > 1 else times)


def peak_rss_mb():
    """This process's peak resident set (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def result(program, precision, times, losses, rss_mb, **extra):
    return {"program": program, "precision": precision, "steps": len(times), "s_per_step": median_after_first(times),
            "step_times": times, "losses": losses, "peak_rss_mb": rss_mb, **extra}


def gradaccum_train(gradaccum, run_dir, settings, precision, config=None):
    """`gradaccum train [CONFIG] --set K=V ...` into run_dir (made afresh); its result from metrics.jsonl."""
    subprocess.run(["rm", "-rf", run_dir], check=True)
    command = [gradaccum, "train"] + ([config] if config else []) + ["--set", f"output_dir={run_dir}"]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gradaccum train failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if '"loss"' in line and '"step_time_s"' in line]
    return result("gradaccum", precision, [r["step_time_s"] for r in records], [r["loss"] for r in records],
                  max(r["peak_rss_mb"] for r in records))


def accumulation_loop(model, optimizer, samples, steps, accumulation, backward=None, no_sync=None, autocast=None,
                      clip=None):
    """`steps` optimizer steps of `accumulation` micro-batches each, the samples (each a dict of the
    model's keyword arguments, labels included) in order: loss / accumulation, backward; then clip,
    step, zero_grad(set_to_none). backward(loss) defaults to loss.backward(); no_sync(last) gives the
    context of a micro-step (Fabric's no_backward_sync); autocast() the forward's (bf16 autocast);
    clip() clips the gradients. Returns the seconds of each step and each window's mean loss."""
    backward = backward or (lambda loss: loss.backward())
    no_sync = no_sync or (lambda last: contextlib.nullcontext())
    autocast = autocast or contextlib.nullcontext
    times, losses = [], []
    for step in range(steps):
        start, window = time.perf_counter(), 0.0
        for s in range(accumulation):
            with no_sync(s + 1 == accumulation):
                with autocast():
                    loss = model(**samples[step * accumulation + s]).loss / accumulation
                backward(loss)
            window += loss.item()
        if clip is not None:
            clip()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        losses.append(window)
    return times, losses


def child_result(command):
    """Runs one benchmark process and returns the JSON object on its last line of output."""
    done = subprocess.run(command, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])
