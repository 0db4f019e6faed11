#!/usr/bin/env bash
# Builds our code with GCC + AddressSanitizer + UndefinedBehaviorSanitizer into ./build-asan and runs
# the test suite under it. libtorch and the other prebuilt libraries are not instrumented; ASan still
# checks every access our code makes, including into tensors' storage.
# Usage: scripts/sanitize.sh [gtest filter]   (default: default_filter below; '*' = every test built;
#        SANITIZE_TESTS='.*' builds every test file, see below)
#        BUILD_DIR=dir: build there instead of ./build-asan; JOBS: build parallelism;
#        SHARDS: test processes run side by side (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${JOBS:-$(nproc)}"
build="${BUILD_DIR:-build-asan}"

start=$(date +%s)
# ccache is off by default so that the time measured is that of a clean CI build; a CI with a warm
# cache can pass CCACHE_DISABLE=0.
export CCACHE_DISABLE="${CCACHE_DISABLE:-1}"
# GRADACCUM_SANITIZE compiles at -O0, the tokenizer's loops at -O1 (CMakeLists.txt). The unity build
# compiles the library's, the CLI's and the tests' .cpp files in batches of 8, so the code they share
# from the libtorch headers is instrumented once per batch instead of once per file. Measured times:
# docs/robustness.md.
# The whole library and the CLI are instrumented; of the tests, by default the files of the code
# that computes addresses and parses bytes itself (kernels, formats, tokenizer and data, optimizers,
# accumulation, checkpoints and logs, reports). The model and end-to-end files drive the same code
# through libtorch's operators, which are not instrumented, and cost most of the build and run time
# (test.sh starts this stage only while 23 of CI's 60 minutes remain: docs/development.md, "CI time").
# SANITIZE_TESTS: a regular expression over the paths below tests/ ('.*' = every file).
unit_tests="base/.*|formats/.*|kernels/.*|optim/.*|data/.*|io/.*|report/.*"
unit_tests+="|dist/(bucketed_grad_sync|sharded_grad_sync|sharded_optimizer)_test.cpp"
unit_tests+="|core/(accumulation|deterministic_accumulation|loss_normalizer|carry|window_tokens|token_budget)_test.cpp"
unit_tests+="|models/(chunked_cross_entropy|sample_dropout)_test.cpp"
# scripts/build.sh configures against the venv's libtorch; only our targets, not the benchmarks.
BUILD_DIR="$build" CMAKE_ARGS="-DCMAKE_CXX_COMPILER=g++ -DGRADACCUM_SANITIZE=ON -DGRADACCUM_BUILD_BENCH=OFF \
  -DGRADACCUM_TEST_FILES=${SANITIZE_TESTS:-$unit_tests}" \
  bash scripts/build.sh -j"$jobs" gradaccum_cli gradaccum_tests
built=$(date +%s)
echo "sanitize.sh: build took $((built - start)) s"

# detect_leaks=0: libtorch keeps process-lifetime singletons (operator registry, thread pools,
# CPU allocator caches) that LeakSanitizer would report at exit; they are not ours to free.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# The suite minus its longest end-to-end runs, which repeat paths the kept tests already take
# under the sanitizers (to keep this stage inside the minutes test.sh gives it; docs/robustness.md):
#  - LmEndToEnd.Kjv*Decompositions*, CliEndToEnd.Decompositions*: the same training loop as the
#    kept LmEndToEnd.FinalCheckpointEvalAndGenerate / CliEndToEnd.WritesConfigMetricsAndSummary,
#    only for more splits (the split arithmetic is covered by the *Accumulation unit tests);
#  - LmEndToEnd.ResumeOfAnLmRunIsBitIdentical: resume is kept in CheckpointResume.*;
#  - DataParallel.OneAllReducePerBucket*, LmEndToEnd.DataParallelPaddedVerses*: two-rank runs like
#    the kept DataParallel.TwoRanksTimesTwoStepsEqualsOneRankAndTheFullBatch;
#  - DataParallelFailures.NoRendezvous*, *.SurvivingRank*: they wait for a timeout, no work to check;
#  - TokenizerReference.*: compare against tiktoken in the venv's Python (what runs is mostly Python);
#    the tokenizer is covered by the other Tokenizer* tests and by fuzz_tokenizer;
#  - MixedPrecisionCurves.*: three 50-step KJV GPT-2 runs (fp32, bf16, fp16) for their loss curves,
#    4 of the 8.5 min the suite took under the sanitizers; the bf16/fp16 code they run is kept in
#    MixedPrecision.* and Fp16LossScaler.* (accumulation, loss scaling, clipping, resume);
#  - CheckpointSignals.SigtermToOneRank*: the two-rank stop inside a window that the kept
#    CheckpointSignals.TwoRanksStopInsideAWindow* takes, reached through the store's poll;
#  - HeapRetention.*: it checks glibc malloc's thresholds, and ASan replaces glibc's malloc with
#    its own allocator (mallopt does nothing there; retain_freed_heap says so by returning false).
default_filter="*-LmEndToEnd.Kjv*:CliEndToEnd.Decompositions*:LmEndToEnd.ResumeOfAnLmRunIsBitIdentical"
default_filter+=":DataParallel.OneAllReducePerBucket*:LmEndToEnd.DataParallelPaddedVerses*"
default_filter+=":DataParallelFailures.NoRendezvous*:DataParallelFailures.SurvivingRank*:TokenizerReference.*"
default_filter+=":MixedPrecisionCurves.*:CheckpointSignals.SigtermToOneRank*:HeapRetention.*"
# AddressSanitizer reserves terabytes of address space for its shadow, so the RLIMIT_AS tests
# cannot run under it; plan's probes train the KJV GPT-2 a dozen times (as LmEndToEnd.Kjv*).
default_filter+=":OomRecoveryUnderRlimit.*:Plan.*"
# Whole training runs through the CLI, 45-63 s each under the sanitizers (2026-11-27): the runs of
# window_tokens, sample_dropout and token_budget, whose units (the plans, the masks, the cuts) the
# kept tests of those files check.
default_filter+=":WindowTokensCli.ARunCounts*:SampleDropoutRuns.VerifyPasses*:SampleDropoutRuns.WithLibtorchs*"
default_filter+=":TokenBudget.TrainsAsThePlainCut*"
# 76 s under the sanitizers (2026-12-02): two-rank stops inside a window, as the kept
# CheckpointSignals.TwoRanksStopInsideAWindow* makes them, then a one-process resume that trains the
# window again (SavedGeometry's choice, which its unit test checks).
default_filter+=":CheckpointSignals.AStopInsideAWindowResumesAtAnother*"
filter="${1:-${SANITIZE_FILTER:-$default_filter}}"
# One gtest process per core, each running every shards-th test (GoogleTest's own sharding): most
# tests use one thread, and separate processes per test would pay libtorch's start-up under ASan
# (~1 s) 190 times.
shards="${SHARDS:-$(nproc)}"
pids=()
for ((i = 0; i < shards; i++)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i \
    "$build"/tests/gradaccum_tests --gtest_filter="$filter" > "$build/sanitize-shard$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for ((i = 0; i < shards; i++)); do
  if ! wait "${pids[$i]}"; then
    failed=1
    echo "sanitize.sh: shard $i of $shards failed; its log ($build/sanitize-shard$i.log) ends:"
    tail -n 60 "$build/sanitize-shard$i.log"
  fi
  grep -E '^\[  (PASSED|FAILED)  \]|tests? from .* ran' "$build/sanitize-shard$i.log" | sed "s/^/shard $i: /"
done
echo "sanitize.sh: tests took $(($(date +%s) - built)) s"
exit $failed
