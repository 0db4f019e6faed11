// Figures about this process that the metrics report.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace gradaccum::io {

// Peak resident set size of this process so far, in MiB (getrusage).
double peak_rss_mb();

// The CUDA caching allocator's peak of allocated memory in MB (PyTorch's max_memory_allocated),
// the largest over the visible devices; 0 in a build without CUDA or where none was used.
double peak_cuda_mb();

// Memory available to a new allocation on `device`, in bytes: MemAvailable of /proc/meminfo for
// the CPU; 0 (unknown) where it is not measured (a GPU, for now) or unreadable.
int64_t available_memory_bytes(const c10::Device& device);

}  // namespace gradaccum::io
