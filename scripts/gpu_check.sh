#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run: the GPU tests (tests/gpu/gpu_test.cpp) and GPT-2 124M
# at context 1024 against PyTorch's eager loop on the same GPU, in fp32 and bf16
# (bench/compare_lm.py --device cuda).
#
# Usage: scripts/gpu_check.sh [BUILD_DIR]   (default build-gpu)
#   PYTHON   a Python whose `torch` is a CUDA build (default: scripts/setup.sh's venv, else python3);
#            its libtorch is the one built against, and it runs the Python peer.
#   OUT      where the logs go (default BUILD_DIR/gpu-check).
#   RUNS, STEPS  processes per program and timed steps per process (default 2 and 5; RUNS=0: tests only).
#   DEPS_PREFIX  an extra CMAKE_PREFIX_PATH entry for yaml-cpp, CLI11, nlohmann_json, fmt, GTest,
#            protobuf, Boost
#            and gloo's headers where the system has none (a machine without Debian's -dev packages).
# A BUILD_DIR that already holds bench/lm_throughput and tests/gradaccum_gpu_tests is used as is.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-gpu}"
venv="${GRADACCUM_VENV:-/opt/gradaccum/venv}"
python="${PYTHON:-$([ -x "$venv/bin/python" ] && echo "$venv/bin/python" || echo python3)}"
out="${OUT:-$build/gpu-check}"
runs="${RUNS:-2}"
steps="${STEPS:-5}"
mkdir -p "$out"

"$python" - <<'EOF' | tee "$out/device.txt"
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
assert torch.cuda.is_available(), "no CUDA device is visible"
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i} {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
EOF

if [ ! -x "$build/bench/lm_throughput" ] || [ ! -x "$build/tests/gradaccum_gpu_tests" ]; then
  torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  prefix="$torch_prefix${DEPS_PREFIX:+;$DEPS_PREFIX}"
  start=$(date +%s)
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON \
    -DGRADACCUM_WITH_NCCL=ON -DCMAKE_PREFIX_PATH="$prefix" \
    ${DEPS_PREFIX:+-DGLOO_INCLUDE_DIR="$DEPS_PREFIX/include"} > "$out/configure.log"
  ninja -C "$build" gradaccum_cli gradaccum_gpu_tests lm_throughput > "$out/build.log"
  echo "gpu_check: built in $(($(date +%s) - start)) s"
fi

# The benchmarks run even when a test fails; the exit status says whether one did.
status=0
# Each test in a process of its own, so that one that kills its process is named with its exit
# status and the others still run.
gpu_tests="$build/tests/gradaccum_gpu_tests"
: > "$out/gpu_tests.log"
for t in $("$gpu_tests" --gtest_list_tests | awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}'); do
  rc=0
  "$gpu_tests" --gtest_filter="$t" >> "$out/gpu_tests.log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    result=$(grep -q "^\[  SKIPPED \] $t " "$out/gpu_tests.log" && echo "skipped" || echo "passed")
  else
    result="FAILED (exit status $rc)"
    status=1
  fi
  echo "gpu_check: $t $result"
done

[ "$runs" -gt 0 ] || exit "$status"
for precision in no bf16; do
  "$python" bench/compare_lm.py --build "$build" --device cuda --shape gpt2-124m-1024 \
    --mixed-precision "$precision" --runs "$runs" --steps "$steps" --warmup-steps 2 --profile-runs 0 \
    --max-wait 0 2>&1 | tee "$out/compare_lm_$precision.log" || status=1
done
[ "$status" = 0 ] || echo "gpu_check: FAILED (see $out)"
exit "$status"
