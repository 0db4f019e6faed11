#!/usr/bin/env bash
# Configures and builds gradaccum (Release) into ./build. Used by main.sh and test.sh.
# A unity build: the library's and the CLI's files are compiled in batches, so
# libtorch's heavy headers are parsed once per batch instead of once per file
# (measured by the sanitizer work: library + CLI 8 min 52 s -> 2 min 46 s of CPU;
# docs/robustness.md). The tests stay one file per compile (tests/CMakeLists.txt).
# Pass -DCMAKE_UNITY_BUILD=OFF for faster incremental rebuilds of one file.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON "$@" > /dev/null
ninja -C build -j"$(nproc)"
