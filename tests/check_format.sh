#!/usr/bin/env bash
# Every C++ file of the repository is as clang-format (the checked-in .clang-format) writes it.
# Generated files (an "@generated" first line) and test fixtures are left as they are.
#   check_format.sh REPOSITORY_ROOT [CLANG_FORMAT]
set -euo pipefail
root=${1:?usage: check_format.sh REPOSITORY_ROOT [CLANG_FORMAT]}
clang_format=${2:-clang-format}
cd "$root"
command -v "$clang_format" >/dev/null || { echo "check_format: $clang_format not found (scripts/setup.sh installs it)" >&2; exit 1; }

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.h' ':!tests/fixtures/*')
else
  mapfile -t files < <(find . -path ./tests/fixtures -prune -o -path './build*' -prune -o \( -name '*.cpp' -o -name '*.h' \) -print | sed 's|^\./||' | sort)
fi

unformatted=0
checked=0
for file in "${files[@]}"; do
  head -n 1 "$file" | grep -q '@generated' && continue
  checked=$((checked + 1))
  if ! "$clang_format" --dry-run --Werror "$file" >/dev/null 2>&1; then
    echo "check_format: $file is not clang-formatted (run: $clang_format -i $file)" >&2
    unformatted=$((unformatted + 1))
  fi
done
if (( unformatted > 0 )); then
  echo "check_format: $unformatted of $checked files differ from clang-format" >&2
  exit 1
fi
echo "check_format: $checked files, all clang-formatted"
