#!/usr/bin/env bash
# Issue 4, item 5: peak RSS per rank with and without ZeRO-1 (AdamW state
# sharded across ranks), two local ranks (`gradaccum train --nproc 2`).
# Model: a GPT-2 of ~81M parameters (6 layers, n_embd 768, the 50257-token
# vocabulary) on packed KJV blocks of 16 tokens, 1 x 2 per rank, 3 steps:
# small activations, so that AdamW's two moments (~650 MB unsharded) are a
# large part of the peak, as in the regime ZeRO-1 is for.
# Two peaks per rank: the training loop's (rank 0: metrics.jsonl's last step
# line; rank 1: rank1.json's train_peak_rss_mb), where ZeRO-1's saving shows,
# and the whole run's (summary.json / rank1.json peak_rss_mb), which adds the
# end-of-run checkpoint: each rank's optimizer state serialized in memory and,
# on rank 0 only, the weights' safetensors file built in memory (~325 MB), a
# transient ZeRO-1 does not touch.
#
# Usage: bench/dist/zero_memory.sh [GRADACCUM_BINARY]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../../build/gradaccum}
config=$here/../../configs/kjv-gpt2.yaml
LOCK=${LOCK:-/tmp/gradaccum-bench.lock}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "| zero_stage | training loop: rank 0 / rank 1 (MB) | whole run: rank 0 / rank 1 (MB) | last loss |"
echo "|---|---|---|---|"
for stage in 0 1; do
  out=$work/zero$stage
  flock "$LOCK" "$bin" train "$config" --nproc 2 --set zero_stage=$stage --set threads=1 \
    --set model.n_layer=6 --set model.n_embd=768 --set model.n_head=12 --set data.packing=true \
    --set data.max_length=16 --set data.train_limit=256 --set data.eval_limit=-1 --set sample.prompt= \
    --set per_device_train_batch_size=1 --set gradient_accumulation_steps=2 --set max_steps=3 \
    --set output_dir="$out" > "$out.log" 2>&1 || { echo "zero_stage $stage failed:"; tail -3 "$out.log"; exit 1; }
  /opt/gradaccum/venv/bin/python - "$out" "$stage" <<'PY'
import json, sys
out, stage = sys.argv[1], sys.argv[2]
steps = [json.loads(l) for l in open(out + "/metrics.jsonl")]
last = [s for s in steps if "loss" in s][-1]
summary = json.load(open(out + "/summary.json"))
rank1 = json.load(open(out + "/rank1.json"))
print(f"| {stage} | {last['peak_rss_mb']:.0f} / {rank1['train_peak_rss_mb']:.0f} "
      f"| {summary['peak_rss_mb']:.0f} / {rank1['peak_rss_mb']:.0f} | {last['loss']:.4f} |")
PY
done
