#!/usr/bin/env bash
# Quick start 1: install what is needed, build the program (not the test suite), and run the main
# job (the built-in default: CNN with GroupNorm on Fashion-MNIST, 16 x 4 accumulation).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh gradaccum_cli
# A second quick start trains again into the same runs/default (a fresh run into an output_dir
# that holds checkpoints is refused otherwise); arguments given here come after and win.
exec build/gradaccum train --set overwrite_output_dir=true "$@"
