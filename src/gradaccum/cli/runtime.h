// Process set-up shared by the commands: threads and the BLAS check.
#pragma once

#include <cstdint>
#include <string>

namespace gradaccum::cli {

// libtorch on Debian starts with one intra-op thread: sets `requested`, or (0)
// this host's cores shared among its `local_ranks`. Returns the count set.
int configure_threads(int64_t requested, int64_t local_ranks);

// Prints the slow-BLAS warning (io/blas_backend.h) on stderr when there is one.
void warn_if_slow_blas();

// One line: the BLAS library, its kernel set and why that set (io/blas_backend.h).
std::string blas_description();
// One line: ATen's CPU kernel set and why that set (io/aten_kernels.h).
std::string aten_description();

}  // namespace gradaccum::cli
