#!/usr/bin/env bash
# Quick start 2: install what is needed, build, and run the whole test suite (what CI runs).
# Each stage's time is printed at the end, also when a stage fails, so that a CI log's tail shows
# where its minutes went (the budget: 60 of CI's 90 minutes on 2 cores; docs/development.md).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
stage_times=()
report() {
  local status=$?
  echo "test.sh: stage times: ${stage_times[*]:-none} total $(($(date +%s) - start)) s (exit status $status)"
}
trap report EXIT
# stage NAME COMMAND...: runs the command and records how long it took.
stage() {
  local name=$1 t0
  shift
  t0=$(date +%s)
  "$@"
  stage_times+=("$name $(($(date +%s) - t0)) s;")
}

stage setup bash scripts/setup.sh
stage build bash scripts/build.sh
# ctest starts the longest tests first when it knows their times; on a fresh clone it knows none,
# and a two-minute test drawn last leaves one core idle meanwhile. tests/ctest_costs.txt holds the
# tests over 8 s from a full local run (ctest's own CTestCostData format), refreshed with
#   awk 'NF==3 && $3>8 {printf "%s 1 %.0f\n", $1, $3}' build/Testing/Temporary/CTestCostData.txt | sort -k3 -nr
costs=build/Testing/Temporary/CTestCostData.txt
[ -f "$costs" ] || { mkdir -p "$(dirname "$costs")" && cp tests/ctest_costs.txt "$costs"; }
stage ctest ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
# The GPU path, compiled and linked, not run (no GPU here): the library, the CLI, the GPU tests and
# the GPU benchmark against libtorch's CUDA libraries with NCCL (GRADACCUM_WITH_NCCL), so that code
# cannot rot. The CPU suite holds no CUDA code, so it is not compiled twice. The GPU tests and the
# benchmark run where a GPU is visible: scripts/gpu_check.sh build-cuda.
BUILD_DIR=build-cuda CMAKE_ARGS="-DGRADACCUM_WITH_NCCL=ON" \
  stage cuda-build bash scripts/build.sh gradaccum_cli gradaccum_gpu_tests lm_throughput
# The two deep checks run after the suite, each only if it can still end inside the budget on a
# machine like CI's (the slowest measured, a 2-vCPU AVX2 EPYC: sanitize 16-23 min, fuzz 4-8 min,
# docs/development.md "CI time"). A check that cannot start says so and why; run it on its
# own with its script. TEST_BUDGET_MIN (default 60) is the budget.
budget_min="${TEST_BUDGET_MIN:-60}"
# stage_if_time NAME MINUTES COMMAND...: the stage, if MINUTES more still fit in the budget.
stage_if_time() {
  local name=$1 needs=$2 used
  shift 2
  used=$((($(date +%s) - start) / 60))
  if [ $((used + needs)) -gt "$budget_min" ]; then
    echo "test.sh: $name NOT RUN: $used of the $budget_min minutes are used and it needs about $needs (run: $*)"
    stage_times+=("$name not run (time);")
    return 0
  fi
  stage "$name" "$@"
}
# The library, the CLI and the unit tests again, built with ASan + UBSan (-O0 but the tokenizer,
# unity build, ccache off), the suite's default filter in one GoogleTest shard per core
# (scripts/sanitize.sh).
stage_if_time sanitize 23 bash scripts/sanitize.sh
# libFuzzer targets (config, safetensors, tokenizer, tokenizer.json), a bounded number of inputs
# each; the config fuzzer links the library the build stage made.
stage_if_time fuzz 8 bash scripts/fuzz.sh
