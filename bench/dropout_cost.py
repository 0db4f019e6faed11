#!/opt/gradaccum/venv/bin/python
"""What per-sample dropout costs: bench/lm_throughput (the 3.4M GPT-2, 8 x 4, fp32) with no dropout,
libtorch's dropout and the per-sample dropout (models/sample_dropout.h), every GPT-2 dropout at
`--dropout`, in alternating processes (the order rotates every round), `--runs` of each. Prints every
process's JSON line and a Markdown table of medians: tokens/s, peak RSS, and the ratios.

  /opt/gradaccum/venv/bin/python bench/dropout_cost.py [--build build] [--runs 5] [--threads 2]
      [--steps 8] [--warmup-steps 2] [--dropout 0.1] [--shape small]
"""
import statistics

import lm_runs

MODES = {"none": [], "libtorch": ["--dropout-rng", "libtorch"], "per_sample": ["--dropout-rng", "per_sample"]}


def main():
    parser = lm_runs.options(__doc__)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--shape", default="small")
    a = parser.parse_args()
    args = ["--threads", str(a.threads), "--steps", str(a.steps), "--warmup-steps", str(a.warmup_steps),
            "--shape", a.shape]
    modes = list(MODES)
    results = {m: [] for m in modes}
    for r in range(a.runs):
        for m in modes[r % 3:] + modes[:r % 3]:
            extra = [] if m == "none" else ["--dropout", str(a.dropout)] + MODES[m]
            results[m].append(lm_runs.run(a.build, args + extra))
    med = {m: {k: statistics.median(x[k] for x in results[m]) for k in ("tokens_per_s", "peak_rss_mb")}
           for m in modes}
    print(f"\n| dropout {a.dropout} ({a.shape}) | tokens/s | vs no dropout | vs libtorch's | peak RSS MB |")
    print("| --- | --- | --- | --- | --- |")
    for m in modes:
        print(f"| {m} | {med[m]['tokens_per_s']:.0f} | {med[m]['tokens_per_s'] / med['none']['tokens_per_s']:.3f} | "
              f"{med[m]['tokens_per_s'] / med['libtorch']['tokens_per_s']:.3f} | {med[m]['peak_rss_mb']:.0f} |")


if __name__ == "__main__":
    main()
