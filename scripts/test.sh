#!/usr/bin/env bash
# Quick start 2: install what is needed, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
# The GPU path, compiled and linked, not run (no GPU here): the library, the CLI and the tests
# against libtorch's CUDA libraries with NCCL (GRADACCUM_WITH_NCCL), so that code cannot rot.
# Its GPU tests (tests/gpu/gpu_test.cpp) and the GPU benchmark run where a GPU is visible:
# scripts/gpu_check.sh build-cuda.
start=$(date +%s)
BUILD_DIR=build-cuda CMAKE_ARGS="-DGRADACCUM_WITH_NCCL=ON" \
  bash scripts/build.sh gradaccum_cli gradaccum_tests gradaccum_gpu_tests float32_cpu_matmuls_check lm_throughput
echo "test.sh: CUDA + NCCL build (compile and link only) took $(($(date +%s) - start)) s"
# libFuzzer targets (config, safetensors, tokenizer, tokenizer.json), a bounded
# number of inputs each (~4 min).
bash scripts/fuzz.sh
# The suite again, built with ASan + UBSan (-O1, unity build, ccache off; the
# default filter of scripts/sanitize.sh, in one GoogleTest shard per core). On a
# clean clone on 25 Nov 2026 (libtorch 2.15) its build took 620 s and its tests
# 124 s; the whole of .ci/run took 36 min (docs/development.md, "CI time").
bash scripts/sanitize.sh
