#!/usr/bin/env bash
# Configures and builds gradaccum (Release) into ./build against the libtorch of the `torch` wheel
# in scripts/setup.sh's venv. Used by main.sh and test.sh.
# Usage: scripts/build.sh [ninja targets...]   (none: everything; BUILD_DIR=dir: another build
#        directory; CMAKE_ARGS="...": more configure arguments, e.g. -DGRADACCUM_WITH_CUDA=ON)
# A unity build: the library's and the CLI's files are compiled in batches, so
# libtorch's heavy headers are parsed once per batch instead of once per file
# (measured by the sanitizer work: library + CLI 8 min 52 s -> 2 min 46 s of CPU;
# docs/robustness.md). The tests stay one file per compile (tests/CMakeLists.txt).
# Pass CMAKE_ARGS=-DCMAKE_UNITY_BUILD=OFF for faster incremental rebuilds of one file.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${GRADACCUM_VENV:-/opt/gradaccum/venv}"
build="${BUILD_DIR:-build}"
torch_prefix=$("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
# shellcheck disable=SC2086
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON \
  -DCMAKE_PREFIX_PATH="$torch_prefix" -DPython3_EXECUTABLE="$venv/bin/python" ${CMAKE_ARGS:-} > /dev/null
ninja -C "$build" -j"$(nproc)" "$@"
