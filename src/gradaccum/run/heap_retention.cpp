#include "gradaccum/run/heap_retention.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace gradaccum::run {

bool retain_freed_heap() {
#if defined(__GLIBC__)
  // glibc's own caps for the dynamic thresholds on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX
  // and twice it). Setting them fixes them: the dynamic rule stops.
  constexpr int kMmapThreshold = 32 * 1024 * 1024;
  constexpr int kTrimThreshold = 2 * kMmapThreshold;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 && mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
#else
  return false;
#endif
}

}  // namespace gradaccum::run
