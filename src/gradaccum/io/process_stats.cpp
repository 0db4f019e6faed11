#include "gradaccum/io/process_stats.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <string>

#ifdef GRADACCUM_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace gradaccum::io {

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

double peak_cuda_mb() {
  double peak = 0.0;
#ifdef GRADACCUM_WITH_CUDA
  if (!c10::cuda::CUDACachingAllocator::get()->initialized()) return 0.0;
  for (c10::DeviceIndex d = 0; d < c10::cuda::device_count(); ++d) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d);
    const auto bytes = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
    peak = std::max(peak, static_cast<double>(bytes) / (1024.0 * 1024.0));
  }
#endif
  return peak;
}

int64_t available_memory_bytes(const c10::Device& device) {
  if (!device.is_cpu()) return 0;
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("MemAvailable:", 0) == 0) return std::stoll(line.substr(13)) * 1024;  // kB
  }
  return 0;
}

}  // namespace gradaccum::io
