"""The CPU kernels of a benchmark's processes, the same on both sides.

gradaccum picks two kernel sets at start-up. OpenBLAS's: when OpenBLAS under-detects the CPU it
switches to the best set the CPU runs (src/gradaccum/io/blas_backend.h: Debian 12's OpenBLAS
0.3.21 runs its SSE3 "Prescott" kernels on CPU models newer than itself, ~4x slower fp32 GEMMs
than "SkylakeX"). And ATen's: on CPUs with AVX512-BF16 it opts in to ATen's AVX512 kernels,
which PyTorch 1.13 leaves opt-in (src/gradaccum/io/aten_kernels.h). A Python peer left on the
defaults would be compared on different kernels. The drivers call `match_cpu_kernels()` first:
it asks the gradaccum program which sets it would use and puts them in OPENBLAS_CORETYPE and
ATEN_CPU_CAPABILITY for every process they start, engine and Python alike (variables the user
already set are kept). `loaded_kernels()` lets the Python programs report what they ran.
"""
import ctypes
import os
import re
import subprocess

import torch


def match_cpu_kernels(gradaccum_bin):
    """Sets OPENBLAS_CORETYPE and ATEN_CPU_CAPABILITY for this process's children to gradaccum's
    choices; returns them as a dict."""
    out = subprocess.run([gradaccum_bin, "--version"], check=True, capture_output=True, text=True).stdout
    blas = re.search(r"BLAS: openblas-\w+, (\w+) kernels", out)
    aten = re.search(r"ATen: (\w+) kernels", out)
    if not blas or not aten:
        raise SystemExit(f"{gradaccum_bin} --version names no OpenBLAS or ATen kernel set:\n{out}")
    os.environ.setdefault("OPENBLAS_CORETYPE", blas.group(1))
    os.environ.setdefault("ATEN_CPU_CAPABILITY", aten.group(1).lower())
    return {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "ATEN_CPU_CAPABILITY")}


def loaded_kernels():
    """The OpenBLAS kernel set and ATen's CPU capability in this process, e.g. "SkylakeX/AVX512"."""
    blas = ""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libopenblas" in line and line.split()[-1].startswith("/")}
    for path in sorted(paths):
        lib = ctypes.CDLL(path)  # already loaded: the same handle, no second copy
        lib.openblas_get_corename.restype = ctypes.c_char_p
        blas = lib.openblas_get_corename().decode()
        break
    aten = re.search(r"CPU capability usage: (\w+)", torch.__config__.show())
    return f"{blas}/{aten.group(1) if aten else ''}"
