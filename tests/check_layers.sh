#!/usr/bin/env bash
# The library's folders are layers that include one way (README, "Layout"): a file may include
# its own folder and the layers below it, never a layer beside or above. And the public headers
# (include/gradaccum) include only public headers, so an installed package is complete.
#   check_layers.sh REPOSITORY_ROOT
set -euo pipefail
root=${1:?usage: check_layers.sh REPOSITORY_ROOT}
cd "$root"

# Bottom to top; folders on one line are side by side and may not include each other.
layers=(
  "base"
  "kernels formats"
  "optim"
  "core"
  "dist data"
  "models"
  "io"
  "run report"
  "cli"
)
declare -A rank
for i in "${!layers[@]}"; do
  for folder in ${layers[$i]}; do rank[$folder]=$i; done
done

violations=0
while IFS= read -r file; do
  folder=$(basename "$(dirname "$file")")
  [[ -n "${rank[$folder]:-}" ]] || { echo "check_layers: $file: folder '$folder' is in no layer" >&2; violations=$((violations + 1)); continue; }
  while IFS= read -r included; do
    if [[ "$file" == include/* && ! -f "include/gradaccum/$included" ]]; then
      echo "check_layers: public header $file includes gradaccum/$included, which is not public" >&2
      violations=$((violations + 1))
    fi
    target=${included%%/*}
    [[ "$target" == "$folder" ]] && continue
    if [[ -z "${rank[$target]:-}" ]]; then
      echo "check_layers: $file includes gradaccum/$included: '$target' is in no layer" >&2
      violations=$((violations + 1))
    elif (( rank[$target] >= rank[$folder] )); then
      echo "check_layers: $file ($folder) includes gradaccum/$included: $target is not below $folder" >&2
      violations=$((violations + 1))
    fi
  done < <(sed -n 's|^#include "gradaccum/\([^"]*\)".*|\1|p' "$file")
done < <(find include/gradaccum src/gradaccum -mindepth 2 -name '*.h' -o -mindepth 2 -name '*.cpp' | sort)

if (( violations > 0 )); then
  echo "check_layers: $violations include(s) against the layers" >&2
  exit 1
fi
echo "check_layers: $(find include/gradaccum src/gradaccum -mindepth 2 -name '*.h' -o -mindepth 2 -name '*.cpp' | wc -l) files, every include points down"
