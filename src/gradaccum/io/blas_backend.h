// Which BLAS serves libtorch's fp32 GEMMs in this process, which kernels it
// runs, and the two things that make it slow here.
//
// 1. The library. Debian's libtorch calls the system libblas.so.3: the
//    reference BLAS is ~40x slower than OpenBLAS, and the pthread OpenBLAS runs
//    its own thread pool that fights libtorch's OpenMP threads (measured on
//    2 cores: 3.6x slower GPT training, 4-5x slower batch-1 CNN than the OpenMP
//    OpenBLAS). blas_warning() says so at start-up; scripts/setup.sh fixes it.
// 2. The kernels. Debian builds OpenBLAS with DYNAMIC_ARCH: it picks its kernel
//    set from the CPU model at load time, and a model newer than the library
//    (0.3.21 in Debian 12) falls back to the SSE3 "Prescott" kernels. On this
//    project's Xeons (family 6, model 207) that fallback runs sgemm at
//    ~30 GFLOP/s per core where the AVX-512 "SkylakeX" kernels run ~120.
//    select_blas_kernels() switches to the kernel set the CPU's instruction
//    set supports, unless the user chose one with OPENBLAS_CORETYPE.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace gradaccum::io {

// The widest vector instruction set of a CPU, as far as BLAS kernels care.
enum class IsaLevel { unknown = 0, sse = 1, avx = 2, avx2 = 3, avx512 = 4 };

struct BlasInfo {
  std::string library;  // path of the shared object that provides sgemm_
  std::string kind;     // openblas-openmp | openblas-pthread | openblas-serial | reference | other | none
  std::string kernels;  // OpenBLAS's kernel set in use ("SkylakeX", "Prescott", ...); "" if not OpenBLAS
};

BlasInfo probe_blas();
// "" for the OpenMP OpenBLAS; otherwise a one-line warning with the fix.
std::string blas_warning(const BlasInfo& info);

// The instruction set this process may use (CPUID and the OS's saved vector state).
IsaLevel cpu_isa_level();
// The instruction set an OpenBLAS kernel set is written for; unknown for names
// this table does not list (those are never replaced).
IsaLevel openblas_kernels_isa(std::string_view kernels);
// The kernel set to force when `current` uses less of the CPU than `cpu`
// offers: SkylakeX (AVX-512), Haswell (AVX2 + FMA) or Sandybridge (AVX).
// nullopt when `current` is as good, or unknown.
std::optional<std::string> better_openblas_kernels(std::string_view current, IsaLevel cpu);

struct BlasKernelSelection {
  std::string detected;  // the kernel set OpenBLAS chose when it was loaded ("" if not OpenBLAS)
  std::string active;    // the kernel set in use now
  std::string reason;    // one line: why active is what it is
};

// Process-wide, once, at program start, before any BLAS call and before other
// threads exist: when the loaded BLAS is OpenBLAS, OPENBLAS_CORETYPE is unset
// and better_openblas_kernels() names a better set, re-runs OpenBLAS's own
// kernel selection (its exported gotoblas_dynamic_init, which reads
// OPENBLAS_CORETYPE) with that set forced. The environment is left as found,
// so child processes decide for themselves. Later calls return the first
// call's result.
const BlasKernelSelection& select_blas_kernels();

}  // namespace gradaccum::io
