// The gradient-accumulation arithmetic as a value type:
//   global batch B = micro-batch b × accumulation steps N × world size W.
#pragma once

#include <cstdint>
#include <string>

namespace gradaccum::core {

class BatchGeometry {
 public:
  // The most samples one optimizer step may hold: 2^53, the largest count a float64 (metrics,
  // throughput, schedules) holds exactly. Far beyond any dataset, and it leaves int64 room for the
  // sums callers make of these counts (a window's end, a ceiling division), so no product or sum
  // of a valid geometry wraps.
  static constexpr int64_t kMaxSamples = int64_t{1} << 53;

  // b × N × W. Throws gradaccum::Error naming the value when any is < 1, and naming the factors
  // (never a wrapped product) when b·N·W is more than kMaxSamples.
  static BatchGeometry from_accumulation(int64_t micro_batch, int64_t accumulation_steps, int64_t world_size = 1);
  // Derives N = B / (b × W); throws, naming the numbers, when B is not a multiple or either is
  // more than kMaxSamples.
  static BatchGeometry from_global(int64_t micro_batch, int64_t global_batch, int64_t world_size = 1);

  int64_t micro_batch() const { return micro_batch_; }
  int64_t accumulation_steps() const { return accumulation_steps_; }
  int64_t world_size() const { return world_size_; }
  // Samples behind one optimizer step: b·N·W (at most kMaxSamples).
  int64_t global_batch() const { return micro_batch_ * accumulation_steps_ * world_size_; }
  // Samples consumed by one micro-step across all ranks: b·W.
  int64_t samples_per_micro_step() const { return micro_batch_ * world_size_; }

  std::string to_string() const;  // "16 x 4 x 1 = 64"

 private:
  BatchGeometry(int64_t b, int64_t n, int64_t w) : micro_batch_(b), accumulation_steps_(n), world_size_(w) {}
  int64_t micro_batch_;
  int64_t accumulation_steps_;
  int64_t world_size_;
};

}  // namespace gradaccum::core
