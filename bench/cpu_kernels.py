"""The CPU kernels of a benchmark's processes, the same on both sides.

gradaccum and the Python peers run the same libtorch (the `torch` wheel of scripts/setup.sh's
venv), whose BLAS is MKL and whose ATen picks its CPU capability (AVX512 where the CPU has it) by
itself. `match_cpu_kernels()` asks the gradaccum program which set it runs and pins
ATEN_CPU_CAPABILITY to it for every process the drivers start, engine and Python alike (a value
the user already set is kept), so that both sides report and run the same kernels.
`loaded_kernels()` lets the Python programs report what they ran.
"""
import os
import re
import subprocess

import torch


def match_cpu_kernels(gradaccum_bin):
    """Sets ATEN_CPU_CAPABILITY for this process's children to gradaccum's; returns the kernels."""
    out = subprocess.run([gradaccum_bin, "--version"], check=True, capture_output=True, text=True).stdout
    found = re.search(r"kernels: BLAS (\w+), ATen (\w+) kernels", out)
    if not found:
        raise SystemExit(f"{gradaccum_bin} --version names no BLAS or ATen kernel set:\n{out}")
    os.environ.setdefault("ATEN_CPU_CAPABILITY", found.group(2).lower())
    return {"BLAS": found.group(1), "ATEN_CPU_CAPABILITY": os.environ["ATEN_CPU_CAPABILITY"]}


def loaded_kernels():
    """The BLAS and ATen's CPU capability in this process, e.g. "mkl/AVX512"."""
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    aten = re.search(r"CPU capability usage: (\w+)", config)
    return f"{blas.group(1) if blas else ''}/{aten.group(1) if aten else ''}"
