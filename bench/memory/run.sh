#!/usr/bin/env bash
# Issue 5, item 5: peak memory flat in the number of accumulation steps N, and
# what gradient checkpointing, the chunked LM-head loss and bf16 save and cost.
#
# Each case is one `gradaccum train` process; its peak RSS (VmHWM, read by the
# program into metrics.jsonl's peak_rss_mb) and its time per micro-step (last
# optimizer step's step_time_s / N) are printed as a Markdown table row.
# Two model shapes on KJV verses, packed into blocks of data.max_length = 128
# tokens so that every micro-batch has the same shape:
#   kjv:        configs/kjv-gpt2.yaml (4 layers, n_embd 128, 7.2M parameters), b = 16
#   gpt2-small: GPT-2 small's shape (12 layers, n_embd 768, 12 heads; 124M
#               parameters with the 50257-token vocabulary), b = 4
# Why packed: with dynamic padding a run's peak follows the longest micro-batch
# it has drawn, and more micro-batches draw longer ones whatever N is. The
# "padded" rows show it: N = 1 for 48 steps and N = 16 for 3 steps see the same
# 768 verses and peak alike, while N = 1 for 3 steps sees only 48 verses.
# Every run takes 2 optimizer steps (time from the second), so that each peak
# holds AdamW's moments together with a micro-batch's activations.
#
# Usage: bench/memory/run.sh [GRADACCUM_BINARY]
# Environment: THREADS [2], SHAPES ["kjv gpt2-small"], LOCK [/tmp/gradaccum-bench.lock]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../../build/gradaccum}
config=$here/../../configs/kjv-gpt2.yaml
THREADS=${THREADS:-2}
SHAPES=${SHAPES:-"kjv gpt2-small"}
LOCK=${LOCK:-/tmp/gradaccum-bench.lock}
[[ -x $bin ]] || { echo "$0: no executable at $bin" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run NAME N STEPS ARGS...
run() {
  local name=$1 n=$2 steps=$3
  shift 3
  local out
  out=$work/$(printf '%s' "$name" | tr -c 'a-zA-Z0-9=' '_')
  flock "$LOCK" "$bin" train "$config" --set gradient_accumulation_steps="$n" --set max_steps="$steps" \
    --set threads="$THREADS" --set data.eval_limit=-1 --set sample.prompt= --set save_steps=0 \
    --set output_dir="$out" "$@" > "$out.log" 2>&1 || { echo "$name failed:"; tail -3 "$out.log"; return 1; }
  /opt/gradaccum/venv/bin/python - "$out/metrics.jsonl" "$name" "$n" "$*" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
steps = [s for s in steps if "loss" in s]
last = steps[-1]
n = int(sys.argv[3])
print(f"| {sys.argv[2]} | {n} | {last['peak_rss_mb']:.0f} | {last['step_time_s'] / n:.3f} | {last['loss']:.4f} | `{sys.argv[4]}` |")
PY
}

echo "| case | N | peak RSS (MB) | s per micro-step | last loss | overrides |"
echo "|---|---|---|---|---|---|"
for shape in $SHAPES; do
  if [[ $shape == kjv ]]; then
    base=(--set per_device_train_batch_size=16 --set data.train_limit=2048 --set data.packing=true)
  else
    base=(--set per_device_train_batch_size=4 --set data.train_limit=512 --set data.packing=true
          --set model.n_layer=12 --set model.n_embd=768 --set model.n_head=12 --set model.n_positions=128)
  fi
  run "$shape N=1" 1 2 "${base[@]}"
  run "$shape N=16" 16 2 "${base[@]}"
  run "$shape N=1 checkpointing" 1 2 "${base[@]}" --set gradient_checkpointing=true
  run "$shape N=1 chunked loss" 1 2 "${base[@]}" --set loss_chunk_tokens=256
  run "$shape N=1 both" 1 2 "${base[@]}" --set gradient_checkpointing=true --set loss_chunk_tokens=256
  run "$shape N=16 both" 16 2 "${base[@]}" --set gradient_checkpointing=true --set loss_chunk_tokens=256
  run "$shape N=1 bf16" 1 2 "${base[@]}" --set mixed_precision=bf16
  if [[ $shape == kjv ]]; then
    padded=(--set per_device_train_batch_size=16 --set data.train_limit=2048)
    run "kjv padded N=1, 3 steps" 1 3 "${padded[@]}"
    run "kjv padded N=1, 48 steps" 1 48 "${padded[@]}"
    run "kjv padded N=16, 3 steps" 16 3 "${padded[@]}"
  fi
done
