// Small helpers shared by the benchmark programs under bench/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "gradaccum/core/check.h"

namespace gradaccum::bench {

// The median of `v` (the mean of the two middle values for an even count).
inline double median(std::vector<double> v) {
  GA_CHECK(!v.empty(), "median of no values");
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// A command-line count (an integer >= 0); throws gradaccum::Error naming the
// program and the option otherwise.
inline int64_t parse_count(const std::string& program, const std::string& key,
                           const std::string& value) {
  size_t used = 0;
  int64_t n = -1;
  try {
    n = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  GA_CHECK(used == value.size() && used > 0 && n >= 0, "{}: {} '{}' is not a count", program, key,
           value);
  return n;
}

}  // namespace gradaccum::bench
