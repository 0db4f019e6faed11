#!/usr/bin/env bash
# Seed 001's experiment on the Fashion-MNIST CNN: batch 1 without accumulation (1x1),
# batch 1 x 16 accumulation steps (1x16) and batch 16 (16x1), on the same training samples,
# for BatchNorm and GroupNorm and several learning rates, over several seeds.
#
# Usage: bench/seed001/run.sh RESULTS_DIR [GRADACCUM_BINARY]
#
# Each run writes RESULTS_DIR/<norm>_lr<lr>_<b>x<n>_s<seed>/ (config.yaml, metrics.jsonl,
# summary.json, time.txt, log.txt). A run whose summary.json exists is skipped, so the script can
# be stopped and restarted. Runs are taken under `flock /tmp/gradaccum-bench.lock` so that they do
# not overlap with other benchmarks on the machine. Order: seed, then norm, then lr, then
# decomposition, so that an interrupted grid still has complete seeds.
#
# Environment overrides (defaults in brackets):
#   NORMS [group batch]  LRS [3e-4 1e-3 3e-3 1e-2]  SEEDS [1 2 3]  DECOMPS [1x1 1x16 16x1]
#   TRAIN_LIMIT [4096]  EVAL_LIMIT [2000]  THREADS [1]  SCHEDULE [constant]  CLIP [0]
# Aggregate with: python3 bench/seed001/aggregate.py RESULTS_DIR
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 RESULTS_DIR [GRADACCUM_BINARY]" >&2
  exit 2
fi
results=$1
here=$(cd "$(dirname "$0")" && pwd)
bin=${2:-$here/../../build-seed001/gradaccum}
[[ -x $bin ]] || { echo "$0: no executable at $bin (build gradaccum_cli first)" >&2; exit 2; }

NORMS=${NORMS:-"group batch"}
LRS=${LRS:-"3e-4 1e-3 3e-3 1e-2"}
SEEDS=${SEEDS:-"1 2 3"}
DECOMPS=${DECOMPS:-"1x1 1x16 16x1"}
TRAIN_LIMIT=${TRAIN_LIMIT:-4096}
EVAL_LIMIT=${EVAL_LIMIT:-2000}
THREADS=${THREADS:-1}
SCHEDULE=${SCHEDULE:-constant}
CLIP=${CLIP:-0}
LOCK=${LOCK:-/tmp/gradaccum-bench.lock}

mkdir -p "$results"
start=$(date +%s)
done_runs=0
skipped=0
failed=0
for seed in $SEEDS; do
  for norm in $NORMS; do
    for lr in $LRS; do
      for dec in $DECOMPS; do
        b=${dec%x*}
        n=${dec#*x}
        name=${norm}_lr${lr}_${dec}_s${seed}
        out=$results/$name
        if [[ -f $out/summary.json ]]; then
          skipped=$((skipped + 1))
          continue
        fi
        rm -rf "$out"
        mkdir -p "$out"
        cmd=("$bin" train
          --set "output_dir=$out"
          --set "seed=$seed"
          --set "threads=$THREADS"
          --set "model.norm=$norm"
          --set "data.train_limit=$TRAIN_LIMIT"
          --set "data.eval_limit=$EVAL_LIMIT"
          --set "per_device_train_batch_size=$b"
          --set "gradient_accumulation_steps=$n"
          --set "num_train_epochs=1"
          --set "max_steps=0"
          --set "optim=adamw"
          --set "weight_decay=0"
          --set "learning_rate=$lr"
          --set "lr_scheduler_type=$SCHEDULE"
          --set "warmup_steps=0"
          --set "max_grad_norm=$CLIP"
          --set "logging_steps=100")
        printf '%q ' "${cmd[@]}" > "$out/command.txt"
        echo >> "$out/command.txt"
        t0=$(date +%s)
        # /usr/bin/time records user+sys CPU seconds, less sensitive to a busy machine than wall time.
        if flock "$LOCK" /usr/bin/time -o "$out/time.txt" -f '{"time_wall_s": %e, "time_user_s": %U, "time_sys_s": %S, "time_max_rss_kb": %M}' \
             "${cmd[@]}" > "$out/log.txt" 2>&1; then
          done_runs=$((done_runs + 1))
          echo "$(date +%T) $name: done in $(( $(date +%s) - t0 )) s"
        else
          rc=$?
          failed=$((failed + 1))
          echo "$(date +%T) $name: FAILED (exit $rc), see $out/log.txt" >&2
        fi
      done
    done
  done
done
echo "ran $done_runs, skipped $skipped (already done), failed $failed in $(( $(date +%s) - start )) s"
