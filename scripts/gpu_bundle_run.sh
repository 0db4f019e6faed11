#!/usr/bin/env bash
# On the GPU machine, from the repository's root, with the bundle of scripts/gpu_bundle.sh at
# .gpu-bundle/ (this script is copied there as run.sh): lays the bundle out as the build directory
# scripts/gpu_check.sh expects and runs it against the machine's own `python3` torch.
# Env: OUT (logs; default ./gpu-out), RUNS, STEPS (gpu_check.sh's; RUNS=0: the GPU tests only).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bundle=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"

site=$(python3 -c 'import importlib.util as u, os; print(os.path.dirname(os.path.dirname(u.find_spec("torch").origin)))')
nvidia=$(ls -d "$site"/nvidia/*/lib 2>/dev/null | paste -sd: -)
export LD_LIBRARY_PATH="$bundle/lib:$site/torch/lib${nvidia:+:$nvidia}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# GPT-2's BPE for the CLI tests (the compiled-in default, /var/lib/gradaccum/gpt2, is absent there).
export GRADACCUM_TOKENIZER_DIR=$bundle/gpt2

library=$(cd "$bundle/lib" && ls libgradaccum.so.*.*.* | head -n 1)
(cd "$bundle/lib" && ln -sfn "$library" "${library%.*}" && ln -sfn "${library%.*}" libgradaccum.so)
# The build directory as it was where the bundle was made (the GPU tests run the CLI at the path
# compiled into them): the same name here, and its checkout's path linked to this one if needed.
compiled_build=$(cat "$bundle/build_dir")
compiled_root=$(dirname "$compiled_build")
build=$root/$(basename "$compiled_build")
mkdir -p "$build/tests" "$build/bench"
ln -sfn "$bundle/bin/gradaccum" "$build/gradaccum"
ln -sfn "$bundle/bin/gradaccum_gpu_tests" "$build/tests/gradaccum_gpu_tests"
ln -sfn "$bundle/bin/lm_throughput" "$build/bench/lm_throughput"
if [ "$(readlink -f "$compiled_root" 2>/dev/null)" != "$root" ]; then
  if [ -e "$compiled_root" ] && [ ! -L "$compiled_root" ]; then
    echo "gpu_bundle_run: $compiled_root exists and is not this checkout: the CLI tests will not find the CLI"
  else
    mkdir -p "$(dirname "$compiled_root")" && ln -sfn "$root" "$compiled_root"
  fi
fi

{
  echo "libraries not found (none expected):"
  ldd "$bundle"/bin/* "$bundle"/lib/*.so* 2>&1 | grep 'not found' | sort -u
  nvidia-smi -L
  "$build/gradaccum" --version
} 2>&1 | tee "$out/run.log"
PYTHON=python3 OUT=$out/gpu-check bash scripts/gpu_check.sh "$build" 2>&1 | tee -a "$out/run.log"
exit "${PIPESTATUS[0]}"
