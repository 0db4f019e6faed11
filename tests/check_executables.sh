#!/usr/bin/env bash
# Every tracked file that starts with "#!" is executable in git's index (mode 100755), so that the
# commands the docs give (bench/compare_lm.py, bench/dist/run_bench.py, ...) run on a fresh clone.
# Test fixtures are left as they are.
#   check_executables.sh DIRECTORY   (a directory of a git work tree; its files are checked)
set -euo pipefail
cd "${1:?usage: check_executables.sh DIRECTORY}"
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "check_executables: $PWD is not in a git work tree" >&2; exit 1; }
prefix=$(git rev-parse --show-prefix)
exclude=()
[[ "$prefix" == tests/fixtures/* ]] || exclude=(':(top,exclude)tests/fixtures')

missing=0
checked=0
while IFS=$'\t' read -r meta file; do
  mode=${meta%% *}
  [[ "$mode" == 100* ]] || continue  # links and submodules
  head -c 2 "$file" 2>/dev/null | grep -q '^#!' || continue
  checked=$((checked + 1))
  if [[ "$mode" != 100755 ]]; then
    echo "check_executables: $prefix$file starts with #! but is not executable (run: git update-index --chmod=+x $prefix$file)" >&2
    missing=$((missing + 1))
  fi
done < <(git ls-files -s -- . "${exclude[@]}")
if (( missing > 0 )); then
  echo "check_executables: $missing of $checked scripts are not executable" >&2
  exit 1
fi
echo "check_executables: $checked scripts, all executable"
