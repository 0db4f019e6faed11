#!/usr/bin/env bash
# Configures and builds gradaccum (Release) into ./build. Used by main.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" > /dev/null
ninja -C build -j"$(nproc)"
