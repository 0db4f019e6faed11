#include "gradaccum/core/out_of_memory.h"

#include <c10/util/Exception.h>
#ifdef GRADACCUM_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <cmath>
#include <new>
#include <regex>

namespace gradaccum::core {

bool is_out_of_memory(const std::exception& error) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr) return true;
  if (dynamic_cast<const std::bad_alloc*>(&error) != nullptr) return true;
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    const std::string message = c10_error->what_without_backtrace();
    return message.find("can't allocate memory") != std::string::npos ||
           message.find("not enough memory") != std::string::npos || message.find("out of memory") != std::string::npos;
  }
  return false;
}

int64_t requested_bytes(const std::string& message) {
  std::smatch match;
  static const std::regex bytes(R"(allocate (\d+) bytes)");
  if (std::regex_search(message, match, bytes)) return std::stoll(match[1].str());
  static const std::regex sized(R"([Tt]ried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB))");
  if (std::regex_search(message, match, sized)) {
    const std::string unit = match[2].str();
    const double scale = unit == "B"     ? 1.0
                         : unit == "KiB" ? 1024.0
                         : unit == "MiB" ? 1048576.0
                         : unit == "GiB" ? 1073741824.0
                                         : 1099511627776.0;
    return static_cast<int64_t>(std::llround(std::stod(match[1].str()) * scale));
  }
  return 0;
}

void release_cached_memory(const c10::Device& device) {
#ifdef GRADACCUM_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

std::optional<BatchGeometry> smaller_micro_batch(const BatchGeometry& g) {
  const int64_t share = g.micro_batch() * g.accumulation_steps();
  for (int64_t b = g.micro_batch() / 2; b >= 1; --b) {
    if (share % b == 0) return BatchGeometry::from_accumulation(b, share / b, g.world_size());
  }
  return std::nullopt;
}

}  // namespace gradaccum::core
