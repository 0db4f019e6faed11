"""The CPU kernels of a benchmark's processes, the same on both sides.

gradaccum and the Python peers run the same libtorch (the `torch` wheel of scripts/setup.sh's
venv), whose BLAS is MKL and whose ATen picks its CPU capability (AVX512 where the CPU has it) by
itself. `match_cpu_kernels()` asks the gradaccum program which set it runs and pins
ATEN_CPU_CAPABILITY to it for every process the drivers start, engine and Python alike (a value
the user already set is kept), so that both sides report and run the same kernels. Where gradaccum
runs MKL's Intel code path on another vendor's CPU (kernels/mkl_intel_path.h), every process
the drivers start preloads bench/mkl_intel_path_preload.cpp's library, which gives MKL the same
answer (in the engine's processes it answers before libgradaccum does), so that the peers run
MKL's same code; `own_mkl_path=True` preloads nothing and leaves the peers MKL's own choice.
`loaded_kernels()` lets the Python programs report what they ran.
"""
import os
import re
import subprocess

import torch


def match_cpu_kernels(gradaccum_bin, own_mkl_path=False):
    """Sets ATEN_CPU_CAPABILITY (and, where gradaccum runs MKL's Intel code path, LD_PRELOAD) for this
    process's children to gradaccum's; returns the kernels."""
    out = subprocess.run([gradaccum_bin, "--version"], check=True, capture_output=True, text=True).stdout
    found = re.search(r"kernels: BLAS (\w+)( \(MKL's Intel code path[^)]*\))?, ATen (\w+) kernels", out)
    if not found:
        raise SystemExit(f"{gradaccum_bin} --version names no BLAS or ATen kernel set:\n{out}")
    os.environ.setdefault("ATEN_CPU_CAPABILITY", found.group(3).lower())
    kernels = {"BLAS": found.group(1), "ATEN_CPU_CAPABILITY": os.environ["ATEN_CPU_CAPABILITY"]}
    if found.group(2):
        kernels["MKL"] = "Intel code path in gradaccum; " + ("MKL's own choice in the peers" if own_mkl_path
                                                              else "the same in the peers")
        if not own_mkl_path:
            preload = os.path.join(os.path.dirname(os.path.abspath(gradaccum_bin)), "bench",
                                   "libmkl_intel_path_preload.so")
            if not os.path.exists(preload):
                raise SystemExit(f"{preload} is missing: build the target mkl_intel_path_preload")
            os.environ["LD_PRELOAD"] = ":".join(p for p in (preload, os.environ.get("LD_PRELOAD", "")) if p)
    return kernels


def loaded_kernels():
    """The BLAS and ATen's CPU capability in this process, e.g. "mkl/AVX512"."""
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    aten = re.search(r"CPU capability usage: (\w+)", config)
    return f"{blas.group(1) if blas else ''}/{aten.group(1) if aten else ''}"
