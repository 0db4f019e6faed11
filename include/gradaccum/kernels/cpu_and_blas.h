// Which CPU this process runs on, what it multiplies itself, and which BLAS
// libtorch was built with: the facts kernels/mkl_intel_path.h and the float32
// routing of 16-bit CPU matmuls (kernels/float32_cpu_matmuls.h) are decided by.
#pragma once

#include <string>

namespace gradaccum::kernels {

// The CPU's vendor string from CPUID leaf 0 ("GenuineIntel", "AuthenticAMD",
// ...), or "" where there is no CPUID (not x86).
const std::string& cpu_vendor();

// Whether cpu_vendor() is Intel's.
bool cpu_is_intel();

// Whether the CPU has AVX512-BF16 or AMX-BF16 (false off x86): where oneDNN's
// bfloat16 GEMMs outrun float32 ones.
bool cpu_has_native_bf16();

// Whether the CPU has AVX512-FP16 (false off x86; the compiler here cannot ask
// for AMX-FP16, which comes with AVX512-FP16 on every CPU that has it).
bool cpu_has_native_fp16();

// Whether libtorch's BLAS is Intel's MKL (the torch wheel's on x86-64).
bool libtorch_blas_is_mkl();

}  // namespace gradaccum::kernels
