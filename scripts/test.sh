#!/usr/bin/env bash
# Quick start 2: install what is needed, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
# libFuzzer targets (config, safetensors, tokenizer, tokenizer.json), a bounded
# number of inputs each (~4 min). The ASan+UBSan suite, scripts/sanitize.sh,
# needs ~19 min to build on 2 cores and runs outside this budget
# (docs/robustness.md).
bash scripts/fuzz.sh
