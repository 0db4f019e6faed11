#!/usr/bin/env bash
# Prepares, on this machine (CUDA toolkit, no GPU), what a GPU machine that has its own CUDA `torch`
# but no compiler setup, no Debian -dev packages and no network needs to run scripts/gpu_check.sh:
# the library, the CLI, the GPU tests and the GPU benchmark compiled against the libtorch of the
# GPU machine's torch version, and the shared libraries they need beyond libtorch, CUDA and glibc.
#
# Usage: scripts/gpu_bundle.sh   (TORCH_VERSION: the GPU machine's torch, default 2.11.0, a PyPI
#        wheel built for CUDA 13; BUNDLE: the output folder, default .gpu-bundle, about 10 MB;
#        BUILD_DIR: default build-gpu-bundle)
# Then, on the GPU machine, from a copy of this repository that holds the bundle:
#        bash .gpu-bundle/run.sh   (RUNS, STEPS as for gpu_check.sh; logs under $OUT)
set -euo pipefail
cd "$(dirname "$0")/.."
version="${TORCH_VERSION:-2.11.0}"
bundle="${BUNDLE:-.gpu-bundle}"
venv="${GRADACCUM_VENV:-/opt/gradaccum/venv}"
torch_root="/opt/gradaccum/torch-$version"
build="${BUILD_DIR:-build-gpu-bundle}"

# libtorch of that version: the wheel's torch/ folder, its CUDA libraries resolved at link time
# through the venv's nvidia-* wheels (the same CUDA 13 sonames).
if [ ! -f "$torch_root/site-packages/torch/share/cmake/Torch/TorchConfig.cmake" ]; then
  wheels="$torch_root/wheel"
  "$venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 "torch==$version" -d "$wheels"
  mkdir -p "$torch_root/site-packages"
  unzip -q -o "$wheels"/torch-"$version"-*.whl 'torch/*' -d "$torch_root/site-packages"
  ln -sfn "$("$venv/bin/python" -c 'import nvidia, os; print(os.path.dirname(nvidia.__file__))')" \
    "$torch_root/site-packages/nvidia"
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON -DGRADACCUM_WITH_NCCL=ON \
  -DCMAKE_PREFIX_PATH="$torch_root/site-packages/torch/share/cmake" \
  -DPython3_EXECUTABLE="$venv/bin/python" > /dev/null
ninja -C "$build" gradaccum_cli gradaccum_gpu_tests lm_throughput

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/gpt2"
cp "$build/gradaccum" "$build/tests/gradaccum_gpu_tests" "$build/bench/lm_throughput" "$bundle/bin/"
library=$(readlink -f "$build/libgradaccum.so")
cp "$library" "$bundle/lib/"
# What the GPU machine's torch wheel brings (libtorch, CUDA, NCCL, libgomp) or its system has
# (glibc, libstdc++) stays out; the rest of the binaries' closure goes in.
provided='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libutil|libstdc\+\+|libgcc_s|libgomp'
provided+='|libtorch|libc10|libcaffe2|libshm|libcuda|libcudart|libcublas|libcufft|libcurand|libcusolver|libcusparse'
provided+='|libnvrtc|libnvJitLink|libnvToolsExt|libnvtx|libcupti|libnccl|libcudnn|libcufile|libnvshmem|libgradaccum)'
LD_LIBRARY_PATH="$PWD/$build:$torch_root/site-packages/torch/lib" ldd "$bundle"/bin/* "$library" |
  awk '/=> \// {print $1, $3}' | sort -u | while read -r name path; do
    [[ $name =~ $provided ]] || cp -L "$path" "$bundle/lib/$name"
  done
find "$bundle/bin" "$bundle/lib" -type f -exec strip --strip-unneeded {} +
cp /var/lib/gradaccum/gpt2/gpt2.tiktoken "$bundle/gpt2/"
cp scripts/gpu_bundle_run.sh "$bundle/run.sh"
# The GPU tests run the CLI at the path compiled into them, inside this build directory.
echo "$PWD/$build" > "$bundle/build_dir"
echo "gpu_bundle: $(du -sh "$bundle" | cut -f1) in $bundle, against torch $version"
