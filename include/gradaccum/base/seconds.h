// Wall time as the engine measures it (step, data and eval times): a monotonic clock, seconds as
// a double.
#pragma once

#include <chrono>

namespace gradaccum::base {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace gradaccum::base
