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
  echo "test.sh: stage times: ${stage_times[*]:-none}; total $(($(date +%s) - start)) s (exit status $status)"
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
stage ctest ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
# The GPU path, compiled and linked, not run (no GPU here): the library, the CLI, the GPU tests and
# the GPU benchmark against libtorch's CUDA libraries with NCCL (GRADACCUM_WITH_NCCL), so that code
# cannot rot. The CPU suite holds no CUDA code, so it is not compiled twice. The GPU tests and the
# benchmark run where a GPU is visible: scripts/gpu_check.sh build-cuda.
BUILD_DIR=build-cuda CMAKE_ARGS="-DGRADACCUM_WITH_NCCL=ON" \
  stage cuda-build bash scripts/build.sh gradaccum_cli gradaccum_gpu_tests lm_throughput
# libFuzzer targets (config, safetensors, tokenizer, tokenizer.json), a bounded number of inputs
# each.
stage fuzz bash scripts/fuzz.sh
# The library, the CLI and the unit tests again, built with ASan + UBSan (-O1, unity build, ccache
# off), the suite's default filter in one GoogleTest shard per core (scripts/sanitize.sh).
stage sanitize bash scripts/sanitize.sh
