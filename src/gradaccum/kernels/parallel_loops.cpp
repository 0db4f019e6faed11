#include "gradaccum/kernels/parallel_loops.h"

#include <ATen/Parallel.h>

#include <mutex>
#include <set>

namespace gradaccum::kernels {

int64_t parallel_loop_threads(int64_t tasks) {
  std::mutex mutex;
  std::set<int> seen;
  at::parallel_for(0, tasks, 1, [&](int64_t, int64_t) {
    const std::lock_guard<std::mutex> lock(mutex);
    seen.insert(at::get_thread_num());
  });
  return static_cast<int64_t>(seen.size());
}

}  // namespace gradaccum::kernels
