#include "gradaccum/kernels/custom_kernels.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "gradaccum/base/check.h"

namespace gradaccum::kernels {
namespace {

// One bit per CustomKernel; read on every kernel call, so an atomic rather than a lock.
std::atomic<uint32_t> enabled_bits{~uint32_t{0}};

uint32_t bit(CustomKernel kernel) { return uint32_t{1} << static_cast<uint32_t>(kernel); }

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

}  // namespace

const std::vector<std::string_view>& custom_kernel_names() {
  static const std::vector<std::string_view> names{"qkv_attention",  "gelu_tanh",  "softmax_cross_entropy", "gelu_mlp",
                                                   "heap_retention", "group_norm", "mkl_intel_path"};
  return names;
}

bool custom_kernel_enabled(CustomKernel kernel) {
  return (enabled_bits.load(std::memory_order_relaxed) & bit(kernel)) != 0;
}

std::vector<CustomKernel> parse_custom_kernels(std::string_view spec) {
  const auto& names = custom_kernel_names();
  spec = trim(spec);
  std::vector<CustomKernel> kernels;
  if (spec == "none") return kernels;
  if (spec == "all") {
    for (size_t i = 0; i < names.size(); ++i) kernels.push_back(static_cast<CustomKernel>(i));
    return kernels;
  }
  for (size_t begin = 0; begin <= spec.size();) {
    size_t end = spec.find(',', begin);
    if (end == std::string_view::npos) end = spec.size();
    const auto name = trim(spec.substr(begin, end - begin));
    const auto it = std::find(names.begin(), names.end(), name);
    GA_CHECK(it != names.end(), "custom_kernels: unknown kernel '{}' (all | none | names from: {})", name,
             fmt::join(names, ", "));
    kernels.push_back(static_cast<CustomKernel>(it - names.begin()));
    begin = end + 1;
  }
  return kernels;
}

void set_custom_kernels(std::string_view spec) {
  uint32_t bits = 0;
  for (const auto kernel : parse_custom_kernels(spec)) bits |= bit(kernel);
  enabled_bits.store(bits, std::memory_order_relaxed);
}

std::string custom_kernels_without(CustomKernel kernel) {
  std::vector<std::string_view> others;
  const auto& names = custom_kernel_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (static_cast<CustomKernel>(i) != kernel) others.push_back(names[i]);
  }
  return fmt::format("{}", fmt::join(others, ","));
}

std::string custom_kernels_description() {
  std::vector<std::string_view> on;
  const auto& names = custom_kernel_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (custom_kernel_enabled(static_cast<CustomKernel>(i))) on.push_back(names[i]);
  }
  return on.empty() ? std::string("none") : fmt::format("{}", fmt::join(on, ", "));
}

}  // namespace gradaccum::kernels
