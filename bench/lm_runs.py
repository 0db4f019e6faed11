"""Shared by the A/B scripts over bench/lm_throughput (deterministic_cost.py, dropout_cost.py): the
command-line options every such comparison takes, and one run of the program."""
import argparse
import json
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def options(description):
    """--build, --runs, --threads, --steps, --warmup-steps; add the comparison's own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--build", default=os.path.join(REPO, "build"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup-steps", type=int, default=2)
    return parser


def run(build, args):
    """bench/lm_throughput with `args` in a process of its own; prints and returns its JSON line."""
    command = [os.path.join(build, "bench", "lm_throughput")] + args
    line = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    print(line, flush=True)
    return json.loads(line)
