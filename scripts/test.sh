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
# The suite again, built with ASan + UBSan (-O1, unity build, ccache off; the
# default filter of scripts/sanitize.sh, in one GoogleTest shard per core). On a
# clean clone on 22 Nov 2026 its build took 381 s and its tests 156-181 s; the
# whole of .ci/run took 18 min (docs/robustness.md).
bash scripts/sanitize.sh
