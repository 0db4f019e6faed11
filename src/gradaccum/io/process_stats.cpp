#include "gradaccum/io/process_stats.h"

#include <sys/resource.h>

namespace gradaccum::io {

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

}  // namespace gradaccum::io
