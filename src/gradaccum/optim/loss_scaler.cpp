#include "gradaccum/optim/loss_scaler.h"

#include <cmath>

#include "gradaccum/base/check.h"

namespace gradaccum::optim {

LossScaler::LossScaler(LossScalerOptions options) : options_(options) {
  GA_CHECK(options_.init_scale > 0.0 && std::isfinite(options_.init_scale),
           "loss scaler: initial scale must be a positive finite number, got {}", options_.init_scale);
  GA_CHECK(options_.growth_factor > 1.0, "loss scaler: growth factor must be > 1, got {}", options_.growth_factor);
  GA_CHECK(options_.backoff_factor > 0.0 && options_.backoff_factor < 1.0,
           "loss scaler: backoff factor must be in (0, 1), got {}", options_.backoff_factor);
  GA_CHECK(options_.growth_interval >= 1, "loss scaler: growth interval must be >= 1, got {}",
           options_.growth_interval);
  state_.scale = options_.init_scale;
}

void LossScaler::update(bool found_inf) {
  if (found_inf) {
    state_.scale *= options_.backoff_factor;
    state_.growth_tracker = 0;
    return;
  }
  if (++state_.growth_tracker == options_.growth_interval) {
    // GradScaler does not grow into inf: a scale that would overflow float32 stays.
    const double grown = state_.scale * options_.growth_factor;
    if (std::isfinite(static_cast<float>(grown))) state_.scale = grown;
    state_.growth_tracker = 0;
  }
}

void LossScaler::restore(const LossScalerState& state) {
  GA_CHECK(state.scale > 0.0 && std::isfinite(state.scale) && state.growth_tracker >= 0,
           "loss scaler: invalid saved state (scale {}, growth tracker {})", state.scale, state.growth_tracker);
  state_ = state;
}

}  // namespace gradaccum::optim
