#!/opt/gradaccum/venv/bin/python
"""What deterministic_accumulation costs: bench/lm_throughput (the 3.4M GPT-2, micro-batch 8) with
and without --deterministic-accumulation, at each accumulation count of `--accumulation`, in
alternating processes (the order flips every round), `--runs` of each. Prints every process's
JSON line and a Markdown table of medians: tokens/s, peak RSS, and the ratios.

  /opt/gradaccum/venv/bin/python bench/deterministic_cost.py [--build build] [--runs 5]
      [--threads 2] [--steps 8] [--warmup-steps 2] [--accumulation 4,16]
"""
import statistics

import lm_runs


def main():
    parser = lm_runs.options(__doc__)
    parser.add_argument("--accumulation", default="4,16")
    a = parser.parse_args()
    rows = []
    for n in [int(x) for x in a.accumulation.split(",")]:
        args = ["--threads", str(a.threads), "--steps", str(a.steps), "--warmup-steps", str(a.warmup_steps),
                "--accumulation", str(n)]
        results = {False: [], True: []}
        for r in range(a.runs):
            for deterministic in ([False, True] if r % 2 == 0 else [True, False]):
                extra = ["--deterministic-accumulation"] if deterministic else []
                results[deterministic].append(lm_runs.run(a.build, args + extra))
        med = {d: {k: statistics.median(x[k] for x in results[d]) for k in ("tokens_per_s", "peak_rss_mb")}
               for d in results}
        rows.append((n, med))
    print("\n| micro-batch x N | plain tokens/s | deterministic tokens/s | speed ratio | plain peak RSS MB "
          "| deterministic peak RSS MB | extra MB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n, med in rows:
        plain, det = med[False], med[True]
        print(f"| 8 x {n} | {plain['tokens_per_s']:.0f} | {det['tokens_per_s']:.0f} | "
              f"{det['tokens_per_s'] / plain['tokens_per_s']:.3f} | {plain['peak_rss_mb']:.0f} | "
              f"{det['peak_rss_mb']:.0f} | {det['peak_rss_mb'] - plain['peak_rss_mb']:+.0f} |")


if __name__ == "__main__":
    main()
