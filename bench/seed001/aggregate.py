#!/usr/bin/env python3
"""Aggregate bench/seed001/run.sh results into a Markdown table.

Usage: python3 bench/seed001/aggregate.py RESULTS_DIR [--csv]

Rows: (norm, learning rate). Columns: for each decomposition (micro-batch x accumulation steps),
test accuracy as mean ± sample std over seeds (n = number of seeds found), and mean wall time
of the training run (summary.json wall_s; CPU seconds user+sys from time.txt in brackets when
present). Standard library only.
"""
import json
import math
import os
import re
import sys
from collections import defaultdict

NAME = re.compile(r"^(?P<norm>[a-z]+)_lr(?P<lr>[0-9.e+-]+)_(?P<b>\d+)x(?P<n>\d+)_s(?P<seed>\d+)$")
DECOMP_ORDER = ["1x1", "1x16", "16x1"]


def mean(xs):
    return sum(xs) / len(xs)


def std(xs):
    if len(xs) < 2:
        return float("nan")
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def load(results):
    runs = defaultdict(list)  # (norm, lr, decomp) -> list of dicts
    missing = []
    for entry in sorted(os.listdir(results)):
        m = NAME.match(entry)
        if not m:
            continue
        path = os.path.join(results, entry)
        summary_path = os.path.join(path, "summary.json")
        if not os.path.isfile(summary_path):
            missing.append(entry)
            continue
        with open(summary_path) as f:
            s = json.load(f)
        rec = {
            "seed": int(m["seed"]),
            "acc": s["eval_accuracy"],
            "wall": s["wall_s"],
            "steps": s.get("steps"),
            "samples": s.get("samples"),
            "eval_samples": s.get("eval_samples"),
            "train_loss": s.get("train_loss"),
        }
        time_path = os.path.join(path, "time.txt")
        if os.path.isfile(time_path):
            with open(time_path) as f:
                t = json.loads(f.read().strip().splitlines()[-1])
            rec["cpu"] = t["time_user_s"] + t["time_sys_s"]
        decomp = f"{m['b']}x{m['n']}"
        runs[(m["norm"], m["lr"], decomp)].append(rec)
    return runs, missing


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    results = argv[1]
    runs, missing = load(results)
    if not runs:
        print(f"no finished runs under {results}", file=sys.stderr)
        return 1
    if "--csv" in argv:
        print("norm,lr,decomp,seed,eval_accuracy,wall_s,cpu_s,steps,samples,train_loss")
        for (norm, lr, dec), recs in sorted(runs.items()):
            for r in sorted(recs, key=lambda r: r["seed"]):
                print(f"{norm},{lr},{dec},{r['seed']},{r['acc']},{r['wall']:.2f},"
                      f"{r.get('cpu', float('nan')):.2f},{r['steps']},{r['samples']},{r['train_loss']}")
        return 0

    decomps = sorted({d for (_, _, d) in runs}, key=lambda d: (DECOMP_ORDER.index(d)
                                                              if d in DECOMP_ORDER else 99, d))
    rows = sorted({(n, lr) for (n, lr, _) in runs}, key=lambda k: (k[0] != "group", k[0], float(k[1])))

    header = ["norm", "lr"]
    for d in decomps:
        b, n = d.split("x")
        label = f"{b}x{n}"
        header += [f"{label} acc", f"{label} wall s [cpu s]"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] * 2 + ["--:"] * (len(header) - 2)) + "|")
    for norm, lr in rows:
        cells = [norm, lr]
        for d in decomps:
            recs = runs.get((norm, lr, d), [])
            if not recs:
                cells += ["–", "–"]
                continue
            accs = [r["acc"] for r in recs]
            sd = std(accs)
            acc = f"{mean(accs):.3f} ± {sd:.3f}" if not math.isnan(sd) else f"{mean(accs):.3f}"
            if len(recs) != 3:
                acc += f" (n={len(recs)})"
            wall = f"{mean([r['wall'] for r in recs]):.1f}"
            cpus = [r["cpu"] for r in recs if "cpu" in r]
            if cpus:
                wall += f" [{mean(cpus):.1f}]"
            cells += [acc, wall]
        print("| " + " | ".join(cells) + " |")

    all_recs = [r for recs in runs.values() for r in recs]
    seeds = sorted({r["seed"] for r in all_recs})
    samples = sorted({r["samples"] for r in all_recs})
    evals = sorted({r["eval_samples"] for r in all_recs})
    print()
    print(f"{len(all_recs)} runs; seeds {seeds}; training samples per run {samples}; "
          f"eval samples {evals}; total training wall time "
          f"{sum(r['wall'] for r in all_recs):.0f} s")
    if missing:
        print(f"unfinished or failed: {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
