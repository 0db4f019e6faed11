// Running out of memory inside a window, and the smaller micro-batch that keeps the global batch.
//
// A micro-step that cannot allocate (CUDA's OutOfMemoryError; on the CPU libtorch's allocator
// error, e.g. under an address-space limit, RLIMIT_AS) costs its window, not the run: the
// Trainer drops the window's partial gradients and sums, cuts the same window into micro-batches
// half as large and twice as many, and trains it again from its first micro-step. The samples,
// their normalization and the parameters are those of the first attempt, so the trajectory is
// the one a run at the smaller micro-batch would have followed (exact accumulation).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>

#include "gradaccum/core/batch_geometry.h"

namespace gradaccum::core {

// Whether `error` says an allocation failed: c10::OutOfMemoryError, the CPU allocator's
// "can't allocate memory" / "not enough memory" errors, or std::bad_alloc.
bool is_out_of_memory(const std::exception& error);

// The bytes the failed allocation asked for, when the message says ("tried to allocate N bytes",
// "Tried to allocate 2.00 GiB"); 0 otherwise.
int64_t requested_bytes(const std::string& message);

// The decomposition to try after running out of memory at `g`: the largest micro-batch b' <= b / 2
// that divides a rank's share of the window (b × N), with N' = b × N / b' (the global batch and W
// unchanged). nullopt when b is 1.
std::optional<BatchGeometry> smaller_micro_batch(const BatchGeometry& g);

// Hands memory that allocators keep for reuse back to the system after an out-of-memory error,
// so that the smaller micro-batch is not refused for memory the failed attempt left cached:
// CUDA's caching allocator empties its cache on `device`; on the CPU glibc returns its heap's
// free top (which heap retention keeps, kernels/heap_retention.h), so under an address-space limit the
// retry gets that space back.
void release_cached_memory(const c10::Device& device);

// Thrown out of a window when a micro-step on this rank (or, with several ranks, on any rank) ran
// out of memory; the window's partial state is gone and the parameters are untouched.
class WindowOutOfMemory : public std::runtime_error {
 public:
  WindowOutOfMemory(const std::string& message, int64_t bytes) : std::runtime_error(message), bytes_(bytes) {}
  int64_t bytes() const { return bytes_; }  // the failed request on this rank (0: unknown, or another rank's)

 private:
  int64_t bytes_;
};

}  // namespace gradaccum::core
