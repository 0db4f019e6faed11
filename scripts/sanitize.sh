#!/usr/bin/env bash
# Builds our code with GCC + AddressSanitizer + UndefinedBehaviorSanitizer into ./build-asan and runs
# the test suite under it. libtorch and the other prebuilt libraries are not instrumented; ASan still
# checks every access our code makes, including into tensors' storage.
# Usage: scripts/sanitize.sh [extra gtest filter]   (default: SANITIZE_FILTER below)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${JOBS:-$(nproc)}"

start=$(date +%s)
# ccache is disabled so that the measured time is that of a clean CI build.
CCACHE_DISABLE=1 cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER=g++ -DGRADACCUM_SANITIZE=ON -DGRADACCUM_BUILD_BENCH=OFF > /dev/null
# gradaccum_tests depends on gradaccum_cli, and tests/CMakeLists.txt points GRADACCUM_CLI at the
# build-asan CLI, so the processes the tests spawn are sanitized too.
CCACHE_DISABLE=1 ninja -C build-asan -j"$jobs" gradaccum_cli gradaccum_tests
built=$(date +%s)
echo "sanitize.sh: build took $((built - start)) s"

# detect_leaks=0: libtorch keeps process-lifetime singletons (operator registry, thread pools,
# CPU allocator caches) that LeakSanitizer would report at exit; they are not ours to free.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
filter="${1:-${SANITIZE_FILTER:-*}}"
build-asan/tests/gradaccum_tests --gtest_filter="$filter"
echo "sanitize.sh: tests took $(($(date +%s) - built)) s"
