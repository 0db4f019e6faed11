#include "gradaccum/core/loss_scaling.h"

#include <cmath>

#include "gradaccum/base/check.h"

namespace gradaccum::core {

namespace {
// A power of two near a micro-batch's item count (at least 1).
double items_for(const Dataset& data, int64_t micro_batch) {
  double items_per_sample = 1.0;
  if (const auto lengths = data.sample_lengths(); lengths.defined() && lengths.numel() > 0) {
    items_per_sample = std::max(1.0, lengths.to(torch::kDouble).mean().item<double>() - 1.0);
  }
  const double items = items_per_sample * static_cast<double>(micro_batch);
  return std::exp2(std::floor(std::log2(std::max(1.0, items))));
}
}  // namespace

LossScaling::LossScaling(MixedPrecision precision, const optim::LossScalerOptions& options, const Dataset& data,
                         int64_t micro_batch)
    : data_(data) {
  if (precision != MixedPrecision::fp16) return;
  scaler_.emplace(options);
  items_ = items_for(data_, micro_batch);
}

void LossScaling::set_micro_batch(int64_t micro_batch) {
  if (scaler_) items_ = items_for(data_, micro_batch);
}

void LossScaling::begin_window(WindowState& w) { w.loss_multiplier = scaler_ ? scaler_->scale() / items_ : 1.0; }

void LossScaling::save(TrainingState& state) const {
  if (!scaler_) return;
  const auto saved = scaler_->state();
  auto& piece = state.piece(kPiece);
  piece.set_real("scale", saved.scale);
  piece.set_integer("growth_tracker", saved.growth_tracker);
}

void LossScaling::restore(const TrainingState& state) {
  const auto piece = state.saved_piece(kPiece);
  const bool saved_fp16 = !piece.scalars.empty();
  if (scaler_ && saved_fp16) {
    scaler_->restore({piece.real("scale"), piece.integer("growth_tracker")});
  } else if (state.position.micro_step > 0) {
    GA_CHECK(static_cast<bool>(scaler_) == saved_fp16,
             "checkpoint: it was saved inside a window {} fp16; resume it with the same "
             "mixed_precision",
             saved_fp16 ? "with" : "without");
  }
}

}  // namespace gradaccum::core
