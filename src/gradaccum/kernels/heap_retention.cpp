#include "gradaccum/kernels/heap_retention.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "gradaccum/kernels/custom_kernels.h"

namespace gradaccum::kernels {

bool retain_freed_heap() {
  if (!custom_kernel_enabled(CustomKernel::heap_retention)) return false;
#if defined(__GLIBC__)
  // Every block from the heap (no mmap), and up to 1 GiB of free heap top kept.
  constexpr int kTrimThreshold = 1024 * 1024 * 1024;
  return mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
#else
  return false;
#endif
}

}  // namespace gradaccum::kernels
