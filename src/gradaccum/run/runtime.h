// Process set-up shared by the commands: threads, and what the program reports about the
// libtorch it runs on.
#pragma once

#include <cstdint>
#include <string>

namespace gradaccum::run {

// Sets libtorch's intra-op threads to `requested`, or (0) this host's cores shared among its
// `local_ranks`. Returns the count set.
int configure_threads(int64_t requested, int64_t local_ranks);

// One line: the libtorch version this program was built against and whether this build can use
// CUDA devices, e.g. "2.15.0 (CPU libraries; the wheel is a CUDA 13.2 build)".
std::string libtorch_description();
// One line: the BLAS serving libtorch's GEMMs and ATen's CPU kernel set, as libtorch reports them,
// e.g. "BLAS mkl, ATen AVX512 kernels", or on an AMD CPU "BLAS mkl (MKL's Intel code path on this
// AuthenticAMD CPU), ATen AVX2 kernels" (kernels/mkl_intel_path.h).
std::string kernels_description();

}  // namespace gradaccum::run
