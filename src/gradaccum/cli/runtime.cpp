#include "gradaccum/cli/runtime.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <thread>

#include "gradaccum/io/aten_kernels.h"
#include "gradaccum/io/blas_backend.h"

namespace gradaccum::cli {

int configure_threads(int64_t requested, int64_t local_ranks) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = requested > 0
                          ? static_cast<int>(requested)
                          : std::max(1, cores / static_cast<int>(std::max<int64_t>(1, local_ranks)));
  at::set_num_threads(threads);
  return threads;
}

void warn_if_slow_blas() {
  if (const auto warning = io::blas_warning(io::probe_blas()); !warning.empty()) {
    fmt::print(stderr, "{}\n", warning);
  }
}

std::string blas_description() {
  const auto info = io::probe_blas();
  const auto& selection = io::select_blas_kernels();
  if (info.kernels.empty()) return fmt::format("{} ({})", info.kind, info.library);
  return fmt::format("{}, {} kernels ({})", info.kind, info.kernels, selection.reason);
}

std::string aten_description() {
  const auto& aten = io::select_aten_kernels();
  return fmt::format("{} kernels ({})", aten.capability, aten.reason);
}

}  // namespace gradaccum::cli
