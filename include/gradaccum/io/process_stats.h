// Figures about this process that the metrics report.
#pragma once

namespace gradaccum::io {

// Peak resident set size of this process so far, in MiB (getrusage).
double peak_rss_mb();

// The CUDA caching allocator's peak of allocated memory in MB (PyTorch's max_memory_allocated),
// the largest over the visible devices; 0 in a build without CUDA or where none was used.
double peak_cuda_mb();

}  // namespace gradaccum::io
