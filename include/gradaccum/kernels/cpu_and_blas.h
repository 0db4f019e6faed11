// Which CPU this process runs on and which BLAS libtorch was built with: the
// facts kernels/mkl_intel_path.h decides by.
#pragma once

#include <string>

namespace gradaccum::kernels {

// The CPU's vendor string from CPUID leaf 0 ("GenuineIntel", "AuthenticAMD",
// ...), or "" where there is no CPUID (not x86).
const std::string& cpu_vendor();

// Whether cpu_vendor() is Intel's.
bool cpu_is_intel();

// Whether libtorch's BLAS is Intel's MKL (the torch wheel's on x86-64).
bool libtorch_blas_is_mkl();

}  // namespace gradaccum::kernels
