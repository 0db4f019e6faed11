#include "gradaccum/core/batch_geometry.h"

#include <optional>

#include "gradaccum/base/check.h"

namespace gradaccum::core {

namespace {

// a × b when it is at most `BatchGeometry::kMaxSamples`, else nullopt (also where int64 would wrap).
std::optional<int64_t> bounded_geometry_product(int64_t a, int64_t b) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product) || product > BatchGeometry::kMaxSamples) return std::nullopt;
  return product;
}

}  // namespace

BatchGeometry BatchGeometry::from_accumulation(int64_t micro_batch, int64_t accumulation_steps, int64_t world_size) {
  GA_CHECK(micro_batch >= 1, "per_device_train_batch_size must be >= 1, got {}", micro_batch);
  GA_CHECK(accumulation_steps >= 1, "gradient_accumulation_steps must be >= 1, got {}", accumulation_steps);
  GA_CHECK(world_size >= 1, "world size must be >= 1, got {}", world_size);
  const auto per_micro_step = bounded_geometry_product(micro_batch, world_size);
  GA_CHECK(per_micro_step && bounded_geometry_product(*per_micro_step, accumulation_steps),
           "per_device_train_batch_size {} x gradient_accumulation_steps {} x world size {} is more than the "
           "largest global batch, 2^53 = {} samples",
           micro_batch, accumulation_steps, world_size, kMaxSamples);
  return BatchGeometry(micro_batch, accumulation_steps, world_size);
}

BatchGeometry BatchGeometry::from_global(int64_t micro_batch, int64_t global_batch, int64_t world_size) {
  GA_CHECK(micro_batch >= 1, "per_device_train_batch_size must be >= 1, got {}", micro_batch);
  GA_CHECK(world_size >= 1, "world size must be >= 1, got {}", world_size);
  GA_CHECK(global_batch <= kMaxSamples, "global_batch_size {} is more than the largest global batch, 2^53 = {} samples",
           global_batch, kMaxSamples);
  const auto per_micro_step = bounded_geometry_product(micro_batch, world_size);
  GA_CHECK(per_micro_step,
           "per_device_train_batch_size {} x world size {} is more than the largest global batch, 2^53 = {} samples",
           micro_batch, world_size, kMaxSamples);
  GA_CHECK(global_batch >= *per_micro_step && global_batch % *per_micro_step == 0,
           "global_batch_size {} is not a multiple of per_device_train_batch_size {} x world size {} "
           "= {}",
           global_batch, micro_batch, world_size, *per_micro_step);
  return BatchGeometry(micro_batch, global_batch / *per_micro_step, world_size);
}

std::string BatchGeometry::to_string() const {
  return fmt::format("{} x {} x {} = {}", micro_batch_, accumulation_steps_, world_size_, global_batch());
}

}  // namespace gradaccum::core
