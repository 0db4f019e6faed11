#!/usr/bin/env bash
# Peak RSS per rank for each zero stage and gradient policy at W = 1, 2 and 4 local ranks
# (`gradaccum train --nproc W`), on a model whose states dominate: a GPT-2 of ~81M parameters
# (6 layers, n_embd 768, the 50257-token vocabulary) on packed KJV blocks of 16 tokens, micro-batch
# 1, the same global batch of 4 (N = 4 / W), 3 steps, AdamW in float32 (16 bytes a parameter of
# weights, gradient and moments: ~1.3 GB unsharded). The training loop's peak of each rank (rank 0:
# metrics.jsonl's last step line; others: rank<R>.json's train_peak_rss_mb); the table gives the
# largest over the ranks and the last loss (the same in every row: the decomposition changes no
# result). The rows marked "no heap retention" run without the process set-up's heap retention
# (custom_kernels without heap_retention), whose retained heap holds the transients a sharded
# rank frees.
#
# With MODEL=qwen2.5-0.5b: the Qwen2.5-0.5B shape instead (qwen2: 24 layers, width 896, 14 query /
# 2 key-value heads, SwiGLU 4864, vocabulary 151936, tied: 494M parameters, 7.9 GB of states
# unsharded), two threads per process at W = 1 and one per rank otherwise, and the rows that fit
# in 24 GB (no stage 0 at W = 4); ~25 minutes on 2 cores.
#
# Usage: [MODEL=gpt2-81m|qwen2.5-0.5b] bench/dist/zero3_memory.sh [GRADACCUM_BINARY]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../../build/gradaccum}
config=$here/../../configs/kjv-gpt2.yaml
LOCK=${LOCK:-/tmp/gradaccum-bench.lock}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

model=${MODEL:-gpt2-81m}
case "$model" in
  gpt2-81m) shape=(--set model.n_layer=6 --set model.n_embd=768 --set model.n_head=12) ;;
  qwen2.5-0.5b)
    shape=(--set model.type=qwen2 --set model.n_layer=24 --set model.n_embd=896 --set model.n_head=14
           --set model.n_kv_head=2 --set model.intermediate_size=4864 --set model.vocab_size=151936
           --set model.n_positions=64) ;;
  *) echo "zero3_memory.sh: MODEL is gpt2-81m or qwen2.5-0.5b, not '$model'" >&2; exit 2 ;;
esac
echo "| W | zero_stage | sharded_grad_sync | training-loop peak RSS, largest rank (MB) | per rank (MB) | last loss |"
echo "|---|---|---|---|---|---|"
no_retention="qkv_attention,gelu_tanh,softmax_cross_entropy,gelu_mlp,group_norm,mkl_intel_path"
run() {  # W stage policy [heap]
  local w=$1 stage=$2 policy=$3 heap=${4:-retained} out=$work/w$1-z$2-$3-${4:-retained}
  local extra=()
  [ "$policy" != "-" ] && extra=(--set sharded_grad_sync="$policy")
  [ "$heap" = "released" ] && extra+=(--set custom_kernels="$no_retention")
  local threads=1
  [ "$w" = 1 ] && [ "$model" != gpt2-81m ] && threads=2
  flock "$LOCK" "$bin" train "$config" --nproc "$w" --set zero_stage="$stage" "${extra[@]}" --set threads=$threads \
    "${shape[@]}" --set data.packing=true \
    --set data.max_length=16 --set data.train_limit=256 --set data.eval_limit=-1 --set sample.prompt= \
    --set per_device_train_batch_size=1 --set gradient_accumulation_steps=$((4 / w)) --set max_steps=3 \
    --set save_steps=0 --set output_dir="$out" > "$out.log" 2>&1 || { echo "W $w zero_stage $stage $policy failed:"; tail -3 "$out.log"; exit 1; }
  /opt/gradaccum/venv/bin/python - "$out" "$w" "$stage" "$policy" "$heap" <<'PY'
import json, sys
out, w, stage, policy, heap = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
if heap == "released":
    policy += " (no heap retention)"
steps = [json.loads(l) for l in open(out + "/metrics.jsonl")]
last = [s for s in steps if "loss" in s][-1]
peaks = [last["peak_rss_mb"]] + [json.load(open(f"{out}/rank{r}.json"))["train_peak_rss_mb"] for r in range(1, w)]
print(f"| {w} | {stage} | {policy} | {max(peaks):.0f} | {' / '.join(f'{p:.0f}' for p in peaks)} | {last['loss']:.4f} |")
PY
}
run 1 0 -
run 2 0 -
run 2 1 -
run 2 2 each_micro_step
run 2 3 defer
run 2 3 each_micro_step
if [ "$model" = qwen2.5-0.5b ]; then
  run 4 3 each_micro_step
  run 4 3 defer
  exit 0
fi
run 4 0 -
run 4 3 each_micro_step
for w in 2 4; do
  run $w 0 - released
  run $w 3 each_micro_step released
done
