// Error handling: library code throws gradaccum::Error with context; only the
// CLI's main turns an exception into a message and an exit code.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (its own header since fmt 11)

#include <stdexcept>
#include <string>

namespace gradaccum {

// A user-facing error: its message is one line naming what is wrong.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace gradaccum

// GA_CHECK(cond, "format {}", args...) throws gradaccum::Error when cond is false.
#define GA_CHECK(cond, ...)                                            \
  do {                                                                 \
    if (!(cond)) throw ::gradaccum::Error(::fmt::format(__VA_ARGS__)); \
  } while (false)
