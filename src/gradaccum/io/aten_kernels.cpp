#include "gradaccum/io/aten_kernels.h"

#include <ATen/Version.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdlib>

#include "gradaccum/io/blas_backend.h"

namespace gradaccum::io {

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  // cpu_isa_level() initializes libgcc's CPU model first.
  return cpu_isa_level() == IsaLevel::avx512 && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

std::string aten_capability() {
  const std::string config = at::show_config();
  const std::string marker = "CPU capability usage: ";
  const auto at = config.find(marker);
  if (at == std::string::npos) return "";
  const auto begin = at + marker.size();
  const auto capability = config.substr(begin, config.find('\n', begin) - begin);
  // Named as ATEN_CPU_CAPABILITY names it (show_config says "NO AVX" for DEFAULT).
  return capability == "NO AVX" ? "DEFAULT" : capability;
}

const AtenKernelSelection& select_aten_kernels() {
  static const AtenKernelSelection selection = [] {
    AtenKernelSelection s;
    if (const char* forced = std::getenv("ATEN_CPU_CAPABILITY"); forced != nullptr) {
      s.reason = fmt::format("ATEN_CPU_CAPABILITY={} (set by the user)", forced);
    } else if (!cpu_has_avx512_bf16()) {
      s.reason = "ATen's default for this CPU";
    } else {
      // ATen reads the variable once, at the first call of a kernel it dispatches
      // by CPU capability: make that call now, then restore the environment.
      setenv("ATEN_CPU_CAPABILITY", "avx512", 1);
      (void)torch::ones({16}).exp_();
      unsetenv("ATEN_CPU_CAPABILITY");
      s.reason = "AVX-512 with BF16: no AVX-512 clock penalty, so the AVX512 kernels";
    }
    s.capability = aten_capability();
    return s;
  }();
  return selection;
}

}  // namespace gradaccum::io
