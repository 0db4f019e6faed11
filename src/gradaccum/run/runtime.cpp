#include "gradaccum/run/runtime.h"

#include <ATen/Version.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <thread>

#include "gradaccum/kernels/mkl_intel_path.h"

namespace gradaccum::run {
namespace {

// A field of at::show_config()'s "Build settings" line ("BLAS_INFO=mkl, ..."); "" if absent.
std::string build_setting(const std::string& config, const std::string& key) {
  const auto at = config.find(key + "=");
  if (at == std::string::npos) return "";
  const auto begin = at + key.size() + 1;
  return config.substr(begin, config.find_first_of(",\n", begin) - begin);
}

}  // namespace

int configure_threads(int64_t requested, int64_t local_ranks) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = requested > 0 ? static_cast<int>(requested)
                                    : std::max(1, cores / static_cast<int>(std::max<int64_t>(1, local_ranks)));
  at::set_num_threads(threads);
  return threads;
}

bool routes_cpu_matmuls_through_float32(core::Bf16CpuMatmuls bf16_setting, core::MixedPrecision precision,
                                        const c10::Device& device, bool cpu_has_native_bf16, bool cpu_has_native_fp16) {
  if (!device.is_cpu()) return false;
  switch (precision) {
    case core::MixedPrecision::bf16:
      return bf16_setting == core::Bf16CpuMatmuls::float32 ||
             (bf16_setting == core::Bf16CpuMatmuls::automatic && !cpu_has_native_bf16);
    case core::MixedPrecision::fp16:
      return !cpu_has_native_fp16;
    case core::MixedPrecision::none:
      break;
  }
  return false;
}

std::string libtorch_description() {
  const auto config = at::show_config();
  const auto cuda = build_setting(config, "CUDA_VERSION");
#ifdef GRADACCUM_WITH_CUDA
  const std::string build = cuda.empty() ? "CPU build" : fmt::format("CUDA {} and NCCL", cuda);
#else
  const std::string build =
      cuda.empty() ? "CPU build" : fmt::format("CPU libraries; the wheel is a CUDA {} build", cuda);
#endif
  return fmt::format("{} ({})", TORCH_VERSION, build);
}

std::string kernels_description() {
  const auto blas = build_setting(at::show_config(), "BLAS_INFO");
  const auto mkl = kernels::mkl_intel_path_description();
  return fmt::format("BLAS {}{}, ATen {} kernels", blas.empty() ? "unknown" : blas,
                     mkl.empty() ? std::string() : fmt::format(" ({})", mkl), at::get_cpu_capability());
}

}  // namespace gradaccum::run
