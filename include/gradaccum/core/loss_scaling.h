// fp16's dynamic loss scaling as the window sees it (optim/loss_scaler.h owns the scale's rules).
//
// Each micro-step's loss *sum* is multiplied by scale / items, with items a power of two near a
// micro-batch's item count, so the scaled gradients have the magnitude a mean loss times the
// scale would give (a sum over thousands of tokens times 65536 would overflow at once); powers of
// two keep the unscale exact. The normalization divides the multiplier out once, in the same pass
// as the division by the window's count; StepSequence checks for inf/nan and updates the scale.
// Without fp16 this piece does nothing and the multiplier stays 1.
#pragma once

#include <cstdint>
#include <optional>

#include "gradaccum/core/mixed_precision.h"
#include "gradaccum/core/trainable.h"
#include "gradaccum/core/window_feature.h"
#include "gradaccum/optim/loss_scaler.h"

namespace gradaccum::core {

class LossScaling final : public WindowFeature {
 public:
  static constexpr const char* kPiece = "loss_scaling";

  // `data` must outlive this object (its sample lengths size the items).
  LossScaling(MixedPrecision precision, const optim::LossScalerOptions& options, const Dataset& data,
              int64_t micro_batch);

  // The scaler StepSequence consults (null without fp16).
  optim::LossScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }
  // The micro-batch changed (OOM recovery): the items follow it.
  void set_micro_batch(int64_t micro_batch);

  void begin_window(WindowState& w) override;
  // The scaler's scale and growth tracker (fp16 only: nothing otherwise).
  void save(TrainingState& state) const override;
  // Continues the saved scale; a state saved inside a window needs the same precision, since its
  // partial gradients carry the saved run's scale (or none).
  void restore(const TrainingState& state) override;

 private:
  const Dataset& data_;
  std::optional<optim::LossScaler> scaler_;  // fp16 only
  double items_ = 1.0;
};

}  // namespace gradaccum::core
