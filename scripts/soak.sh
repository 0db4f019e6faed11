#!/usr/bin/env bash
# A bounded soak: one run of STEPS optimizer steps on --nproc W ranks, interrupted FAULTS times by
# SIGTERM or SIGKILL delivered at random moments (seeded) to the launcher or to a random rank, each
# followed by the restart a supervisor makes (the same command, resume_from_checkpoint=auto). The
# final weights are compared with an uninterrupted run's, byte for byte. With --worlds 1,2 each
# restart draws its W from the list (the global batch stays, N follows; a checkpoint saved inside
# a window at another W trains that window again): the reduction order then changes with W, so
# the comparison is the largest relative difference of every step's loss, grad norm and weight
# norm (the last record of each step) against the uninterrupted run at --nproc.
# Prints one JSON line: faults survived, the kinds delivered, the worlds drawn, steps redone, wall
# time, identical, largest_difference.
#
# Usage: scripts/soak.sh [--steps 200] [--faults 20] [--seed 1] [--nproc 2] [--worlds 1,2]
#        [--out DIR] [--gradaccum build/gradaccum]
# tests/run/soak_test.cpp runs a short one in CI; docs/robustness.md keeps the long one's result.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=200 faults=20 seed=1 nproc=2 worlds="" out="" bin="build/gradaccum"
while (($#)); do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --faults) faults=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --nproc) nproc=$2; shift 2 ;;
    --worlds) worlds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --gradaccum) bin=$2; shift 2 ;;
    *) echo "soak.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -x "$bin" ]] || { echo "soak.sh: $bin is not built (scripts/build.sh gradaccum_cli)" >&2; exit 2; }
[[ -n "$out" ]] || out=$(mktemp -d /tmp/gradaccum-soak.XXXXXX)
mkdir -p "$out"
RANDOM=$seed
IFS=, read -r -a world_list <<< "${worlds:-$nproc}"
for w in "${world_list[@]}"; do
  [[ "$w" =~ ^[1-8]$ ]] || { echo "soak.sh: --worlds: '$w' is not a world size of 1 to 8" >&2; exit 2; }
done

# The CNN in float64, a checkpoint every 3 steps, windows of 16 micro-steps of 8 per rank at W = 2
# (~0.15 s a step here, so that faults land in training, saving and start-up alike).
run=(train --set dtype=float64 --set model.channels=[8,16] --set model.hidden=[32] --set data.train_limit=2048
     --set data.eval_limit=-1 --set threads=1 --set per_device_train_batch_size=8 --set global_batch_size=256
     --set max_steps="$steps" --set save_steps=3 --set learning_rate=3e-3 --set warmup_steps=2)

"$bin" "${run[@]}" --nproc "$nproc" --set output_dir="$out/straight" > "$out/straight.log" 2>&1

last_step() {  # the last step record's step in a metrics.jsonl (0: none)
  local line
  line=$(grep '"loss"' "$1" 2>/dev/null | tail -n 1 || true)
  [[ -n "$line" ]] || { echo 0; return; }
  sed -E 's/.*"step":([0-9]+).*/\1/' <<< "$line"
}

# Where the faults land, independent of the machine's speed: a quarter of them in an attempt's
# start-up (process group, data, checkpoint read), the others each just after the run records a
# step drawn from 1 .. STEPS-1 (distinct, ascending: a window in flight or a checkpoint being
# saved). A run that records a step < STEPS is still training, so every such fault interrupts it.
pool=()
for ((i = 1; i < steps; ++i)); do pool+=("$i"); done
for ((i = ${#pool[@]} - 1; i > 0; --i)); do
  j=$((RANDOM % (i + 1))) t=${pool[i]}
  pool[i]=${pool[j]} pool[j]=$t
done
targets=($(printf '%s\n' "${pool[@]:0:faults}" | sort -n))
next_target=0

start_ns=$(date +%s%N)
delivered=0 redone=0 kinds=() drawn=()
attempt=0
while :; do
  attempt=$((attempt + 1))
  log="$out/attempt$attempt.log"
  world=$nproc
  ((${#world_list[@]} > 1)) && world=${world_list[$((RANDOM % ${#world_list[@]}))]}
  ((${#world_list[@]} == 1)) && world=${world_list[0]}
  drawn+=("$world")
  "$bin" "${run[@]}" --nproc "$world" --set resume_from_checkpoint=auto --set output_dir="$out/soak" > "$log" 2>&1 &
  launcher=$!
  if ((delivered < faults)); then
    if ((RANDOM % 4 == 0 || next_target >= ${#targets[@]})); then
      sleep "0.$(printf '%03d' $((RANDOM % 1000)))"  # in start-up
    else
      target_step=${targets[$next_target]}
      next_target=$((next_target + 1))
      while kill -0 "$launcher" 2>/dev/null && (($(last_step "$out/soak/metrics.jsonl") < target_step)); do
        sleep 0.02
      done
      sleep "0.$(printf '%03d' $((RANDOM % 150)))"  # into the next window or the save after the step
    fi
    if kill -0 "$launcher" 2>/dev/null; then
      signal=$([[ $((RANDOM % 2)) == 0 ]] && echo TERM || echo KILL)
      target=$launcher who=launcher
      if ((RANDOM % 2)); then
        ranks=($(pgrep -P "$launcher" || true))
        if ((${#ranks[@]})); then
          target=${ranks[$((RANDOM % ${#ranks[@]}))]} who=rank
        fi
      fi
      kill -s "$signal" "$target" 2>/dev/null || true
      delivered=$((delivered + 1))
      kinds+=("\"$signal $who\"")
    fi
  fi
  status=0
  { wait "$launcher"; } 2> /dev/null || status=$?
  # A SIGKILLed launcher takes its ranks with it (PR_SET_PDEATHSIG); let them go.
  sleep 0.2
  if grep -q '"loss"' "$out/soak/metrics.jsonl" 2>/dev/null && [[ -f "$out/soak/final/model.safetensors" ]] &&
     (( $(last_step "$out/soak/metrics.jsonl") == steps )) && ((status == 0)); then
    break
  fi
  if ((attempt > faults + 5)); then
    echo "soak.sh: no progress after $attempt attempts; see $log" >&2; exit 1
  fi
  # Steps trained in this attempt past the checkpoint the next attempt resumes from are redone.
  reached=$(last_step "$out/soak/metrics.jsonl")
  resume=$( (ls "$out/soak/checkpoints" 2>/dev/null || true) | sed -n 's/^step-\([0-9]*\)$/\1/p' | sort -n | tail -n 1)
  redone=$((redone + reached - ${resume:-0}))
done
wall_ms=$(( ($(date +%s%N) - start_ns) / 1000000 ))
identical=false
cmp -s "$out/straight/final/model.safetensors" "$out/soak/final/model.safetensors" && identical=true
# The last record of each step, against the uninterrupted run's: the largest relative difference
# of loss, grad_norm and weight_norm over the steps (0 when the steps agree bit for bit).
largest=$(awk '
  function field(line, key,   m) { return match(line, "\"" key "\":[-0-9.eE+]+") ? substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 3) + 0 : "" }
  function rel(a, b) { d = a - b; d = d < 0 ? -d : d; s = b < 0 ? -b : b; return s > 0 ? d / s : d }
  /"loss"/ { st = field($0, "step"); for (i = 1; i <= 3; ++i) v[FILENAME == ARGV[1], st, i] = field($0, k[i]) }
  BEGIN { k[1] = "loss"; k[2] = "grad_norm"; k[3] = "weight_norm" }
  END { worst = 0; n = 0
        for (key in v) { split(key, part, SUBSEP); if (part[1] != 1) continue; ++n
                         for (i = 1; i <= 3; ++i) { r = rel(v[0, part[2], i], v[1, part[2], i]); if (r > worst) worst = r } }
        printf "%.3g", n ? worst : 1 }' "$out/straight/metrics.jsonl" "$out/soak/metrics.jsonl")
kinds_json=$(IFS=,; echo "${kinds[*]}")
drawn_json=$(IFS=,; echo "${drawn[*]}")
printf '{"steps": %d, "faults": %d, "attempts": %d, "kinds": [%s], "worlds": [%s], "steps_redone": %d, "wall_s": %d.%03d, "identical": %s, "largest_difference": %s, "out": "%s"}\n' \
  "$steps" "$delivered" "$attempt" "$kinds_json" "$drawn_json" "$redone" $((wall_ms / 1000)) $((wall_ms % 1000)) "$identical" "$largest" "$out"
