// The dynamic loss scaler of fp16 training (torch.cuda.amp.GradScaler's
// semantics, applied once per optimizer step, never per micro-step).
//
// fp16 has 5 exponent bits: gradients below ~6e-8 flush to zero. Multiplying
// the loss by a large scale S lifts them into range; the step then divides the
// gradients by S once (the engine folds this into its one normalization
// multiply), checks them for inf/nan, and either steps or skips:
//   - a window whose gradients hold inf/nan is skipped (parameters and
//     optimizer state untouched) and S *= backoff_factor;
//   - after growth_interval consecutive good steps, S *= growth_factor.
// Scales stay powers of two (with the default factors), so scaling and
// unscaling are exact in binary floating point.
#pragma once

#include <cstdint>

namespace gradaccum::optim {

struct LossScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

// What a checkpoint keeps of a scaler (its options come from the config).
struct LossScalerState {
  double scale = 65536.0;
  int64_t growth_tracker = 0;  // consecutive good steps since the last change
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  // The factor this step's micro-step losses are multiplied by.
  double scale() const { return state_.scale; }
  // Once per optimizer step, after the inf/nan check of its gradients.
  void update(bool found_inf);

  LossScalerState state() const { return state_; }
  void restore(const LossScalerState& state);
  const LossScalerOptions& options() const { return options_; }

 private:
  LossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace gradaccum::optim
