#include "gradaccum/core/trainer_options.h"

#include "gradaccum/base/check.h"

namespace gradaccum::core {

OptionNames::OptionNames(std::map<std::string, std::string> keys, std::string noun)
    : keys_(std::move(keys)), noun_(std::move(noun)) {}

std::string OptionNames::name(const std::string& field) const {
  const auto it = keys_.find(field);
  return it != keys_.end() ? it->second : field;
}

std::string OptionNames::subject(const std::string& field) const { return fmt::format("{} '{}'", noun_, name(field)); }

void validate(const TrainerOptions& o, int64_t world_size, const OptionNames& names) {
  const auto naive = to_string(LossNormalization::micro_batch);
  GA_CHECK(o.mixed_precision == MixedPrecision::none || o.dtype == torch::kFloat,
           "{}: {} keeps parameters in float32 and needs {}: float32", names.subject("mixed_precision"),
           to_string(o.mixed_precision), names.name("dtype"));
  if (o.window_tokens > 0) {
    GA_CHECK(o.global_batch_size == 0, "{}: cannot be combined with {} (the windows are measured in tokens)",
             names.subject("window_tokens"), names.name("global_batch_size"));
    GA_CHECK(!o.deterministic_accumulation,
             "{}: cannot be combined with {} (its tree needs the same number of micro-batches in every window)",
             names.subject("window_tokens"), names.name("deterministic_accumulation"));
    GA_CHECK(o.last_window != LastWindow::carry, "{}: cannot be combined with {}: carry",
             names.subject("window_tokens"), names.name("last_window"));
    GA_CHECK(o.loss_normalization != LossNormalization::micro_batch,
             "{}: needs {} window or sum, not {} (N varies per window)", names.subject("window_tokens"),
             names.name("loss_normalization"), naive);
  }
  GA_CHECK(o.max_tokens_per_micro_batch == 0 || !o.deterministic_accumulation,
           "{}: cannot be combined with {} (the number of micro-batches per rank would depend on the world size)",
           names.subject("max_tokens_per_micro_batch"), names.name("deterministic_accumulation"));
  if (o.deterministic_accumulation) {
    GA_CHECK(o.loss_normalization != LossNormalization::micro_batch, "{}: needs {} window or sum, not {}",
             names.subject("deterministic_accumulation"), names.name("loss_normalization"), naive);
    GA_CHECK(world_size >= 1 && (world_size & (world_size - 1)) == 0,
             "{}: the world size must be a power of two, not {}", names.subject("deterministic_accumulation"),
             world_size);
  }
  GA_CHECK(o.max_steps > 0 || o.num_train_epochs >= 1, "{} must be >= 1, got {}", names.name("num_train_epochs"),
           o.num_train_epochs);
}

BatchGeometry TrainerOptions::geometry(int64_t world_size) const {
  if (window_tokens > 0) return BatchGeometry::from_accumulation(per_device_train_batch_size, 1, world_size);
  if (global_batch_size > 0) {
    return BatchGeometry::from_global(per_device_train_batch_size, global_batch_size, world_size);
  }
  return BatchGeometry::from_accumulation(per_device_train_batch_size, gradient_accumulation_steps, world_size);
}

}  // namespace gradaccum::core
