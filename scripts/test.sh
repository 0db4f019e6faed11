#!/usr/bin/env bash
# Quick start 2: install what is needed, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
# libFuzzer targets (config, safetensors, tokenizer, tokenizer.json), a bounded
# number of inputs each (~4 min).
bash scripts/fuzz.sh
# The suite again, built with ASan + UBSan (-O1, unity build, ccache off). Its
# clean build measured 13.7 min of CPU (user + sys), about 7 min on 2 idle
# cores; its tests (the default filter of scripts/sanitize.sh, 190 tests)
# 5 min 44 s on 2 busy cores. That keeps CI's whole run under its 30 minutes
# (docs/robustness.md).
bash scripts/sanitize.sh
