#!/usr/bin/env bash
# Seed 001's experiment on the language-model workload: fine-tune the KJV GPT-2
# (configs/kjv-gpt2.yaml's output) to classify Old vs New Testament verses
# (configs/kjv-gpt2-classify.yaml, balanced: 50% baseline) as batch 1 (1x1),
# batch 1 x 16 accumulation steps (1x16) and batch 16 (16x1), on the same
# verses in the same order, over learning rates and seeds.
#
# Usage: bench/seed001/run_lm.sh RESULTS_DIR CHECKPOINT_DIR [GRADACCUM_BINARY]
#
# Runs are named kjv_lr<lr>_<b>x<n>_s<seed>, so bench/seed001/aggregate.py
# tabulates them (its "norm" column reads "kjv"). A run whose summary.json
# exists is skipped; runs take `flock /tmp/gradaccum-bench.lock`.
# Environment overrides: LRS [3e-5 1e-4 3e-4]  SEEDS [1 2 3]  DECOMPS [1x1 1x16 16x1]
#   TRAIN_LIMIT [1024]  EVAL_LIMIT [1000]  THREADS [1]
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 RESULTS_DIR CHECKPOINT_DIR [GRADACCUM_BINARY]" >&2
  exit 2
fi
results=$1
checkpoint=$2
here=$(cd "$(dirname "$0")" && pwd)
bin=${3:-$here/../../build/gradaccum}
config=$here/../../configs/kjv-gpt2-classify.yaml
[[ -x $bin ]] || { echo "$0: no executable at $bin" >&2; exit 2; }
[[ -f $checkpoint/config.json ]] || { echo "$0: $checkpoint is not an HF checkpoint (run configs/kjv-gpt2.yaml)" >&2; exit 2; }

LRS=${LRS:-"3e-5 1e-4 3e-4"}
SEEDS=${SEEDS:-"1 2 3"}
DECOMPS=${DECOMPS:-"1x1 1x16 16x1"}
TRAIN_LIMIT=${TRAIN_LIMIT:-1024}
EVAL_LIMIT=${EVAL_LIMIT:-1000}
THREADS=${THREADS:-1}
LOCK=${LOCK:-/tmp/gradaccum-bench.lock}

mkdir -p "$results"
for seed in $SEEDS; do
  for lr in $LRS; do
    for dec in $DECOMPS; do
      name=kjv_lr${lr}_${dec}_s${seed}
      out=$results/$name
      [[ -f $out/summary.json ]] && continue
      rm -rf "$out" && mkdir -p "$out"
      cmd=("$bin" train "$config"
        --set "output_dir=$out" --set "seed=$seed" --set "threads=$THREADS"
        --set "model.hf_checkpoint=$checkpoint"
        --set "data.train_limit=$TRAIN_LIMIT" --set "data.eval_limit=$EVAL_LIMIT"
        --set "per_device_train_batch_size=${dec%x*}" --set "gradient_accumulation_steps=${dec#*x}"
        --set "learning_rate=$lr" --set "lr_scheduler_type=constant" --set "warmup_ratio=0"
        --set "max_grad_norm=0" --set "save_steps=0" --set "logging_steps=100")
      printf '%q ' "${cmd[@]}" > "$out/command.txt"
      echo >> "$out/command.txt"
      if flock "$LOCK" /usr/bin/time -o "$out/time.txt" -f '{"time_wall_s": %e, "time_user_s": %U, "time_sys_s": %S, "time_max_rss_kb": %M}' \
           "${cmd[@]}" > "$out/log.txt" 2>&1; then
        echo "$(date +%T) $name: done"
      else
        echo "$(date +%T) $name: FAILED, see $out/log.txt" >&2
      fi
    done
  done
done
