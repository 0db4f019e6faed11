#!/usr/bin/env bash
# Checks that the row kernels compiled with GRADACCUM_VECTOR_CLONES
# (src/gradaccum/kernels/vector_exp.h) are vectorized in their AVX2 clone, not
# just in the AVX-512 one. A loop that GCC cannot if-convert stays scalar
# without AVX-512's masks, silently: under -ftrapping-math every AVX2 clone of
# the GELU, softmax and loss kernels was scalar, and a micro-step of the
# benchmark GPT took 232 ms instead of 180 on an AVX2 EPYC (BENCHMARKS.md).
#
#   check_vector_clones.sh LIBRARY [MIN_PACKED]
#
# For every `[clone .arch_x86_64_v3]` function in LIBRARY, counts the packed
# single-precision arithmetic instructions on 256-bit registers (vmulps,
# vaddps, vfmadd…ps, vmaxps, … on %ymm); fails naming each clone with fewer
# than MIN_PACKED (default 6; with GCC 12 the scalar clones had 0 to 4, the
# vectorized ones have 7 (softmax_grad_rows, the smallest loop) to 62). The
# GroupNorm loops (kernels/group_norm.cpp, named *_rows_f) are one to four
# operations per element: their vectorized clones hold 1 to 8 packed ops and a
# scalar one none, so they need 1.
set -euo pipefail
library=$1
min_packed=${2:-6}
command -v objdump >/dev/null || { echo "check_vector_clones: objdump not found" >&2; exit 1; }
[[ -r "$library" ]] || { echo "check_vector_clones: cannot read $library" >&2; exit 1; }

report=$(objdump -d --no-show-raw-insn "$library" | c++filt | awk -v min="$min_packed" '
  /^[0-9a-f]+ <.*\[clone \.arch_x86_64_v3\]>:$/ { name = $0; packed = 0; need = (name ~ /_rows_f\(/) ? 1 : min; next }
  name != "" && /v(mul|add|sub|div|max|min|fn?m(add|sub)[0-9]+)ps[ \t].*%ymm/ { packed++ }
  name != "" && /^$/ {
    clones++
    if (packed < need) { print "scalar: " packed " packed ops in " name; bad++ }
    name = ""
  }
  END { print "clones " clones+0 " scalar " bad+0 }')
echo "$report"
summary=$(tail -n 1 <<<"$report")
read -r _ clones _ scalar <<<"$summary"
if ((clones == 0)); then
  echo "check_vector_clones: no AVX2 clones found in $library" >&2
  exit 1
fi
((scalar == 0))
