"""The OpenBLAS kernel set of a benchmark's processes, the same on both sides.

gradaccum switches OpenBLAS to the best kernel set this CPU runs when OpenBLAS under-detects
the CPU (src/gradaccum/io/blas_backend.h: Debian 12's OpenBLAS 0.3.21 runs its SSE3
"Prescott" kernels on CPU models newer than itself, ~4x slower fp32 GEMMs than "SkylakeX").
A Python peer left on the detected set would then be compared on a different BLAS. The
drivers call `match_blas_kernels()` first: it asks the gradaccum program which set it would
use and puts that set in OPENBLAS_CORETYPE for every process they start, engine and Python
alike (an OPENBLAS_CORETYPE the user already set is kept). `loaded_kernels()` lets the Python
programs report the set they actually ran.
"""
import ctypes
import os
import re
import subprocess


def match_blas_kernels(gradaccum_bin):
    """Sets OPENBLAS_CORETYPE for this process's children to gradaccum's kernel set; returns it."""
    if os.environ.get("OPENBLAS_CORETYPE"):
        return os.environ["OPENBLAS_CORETYPE"]
    out = subprocess.run([gradaccum_bin, "--version"], check=True, capture_output=True, text=True).stdout
    m = re.search(r"BLAS: openblas-\w+, (\w+) kernels", out)
    if not m:
        raise SystemExit(f"{gradaccum_bin} --version names no OpenBLAS kernel set:\n{out}")
    os.environ["OPENBLAS_CORETYPE"] = m.group(1)
    return m.group(1)


def loaded_kernels():
    """The kernel set of the OpenBLAS loaded in this process ("" when none is)."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libopenblas" in line and line.split()[-1].startswith("/")}
    for path in sorted(paths):
        lib = ctypes.CDLL(path)  # already loaded: the same handle, no second copy
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    return ""
