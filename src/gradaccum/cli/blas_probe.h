// Which BLAS serves libtorch's fp32 GEMMs in this process, and a warning when it
// is a slow one. Debian's libtorch calls the system libblas.so.3: the reference
// BLAS is ~40x slower than OpenBLAS, and the pthread OpenBLAS runs its own
// thread pool that fights libtorch's OpenMP threads (measured on 2 cores: 3.6x
// slower GPT training, 4-5x slower batch-1 CNN than the OpenMP OpenBLAS).
#pragma once

#include <string>

namespace gradaccum::cli {

struct BlasInfo {
  std::string library;  // path of the shared object that provides sgemm_
  std::string kind;     // openblas-openmp | openblas-pthread | openblas-serial | reference | other
};

BlasInfo probe_blas();
// "" for the OpenMP OpenBLAS; otherwise a one-line warning with the fix.
std::string blas_warning(const BlasInfo& info);

}  // namespace gradaccum::cli
