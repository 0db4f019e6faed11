// The decomposition a state was saved with: the Trainer's own piece of a TrainingState.
//
// A state between windows continues with any decomposition of the same global batch (or, with
// windows measured in tokens, any at all); a state saved inside a window only with the same
// b, N and W, since its partial sums belong to particular micro-batches of particular ranks.
#pragma once

#include <cstdint>

#include "gradaccum/core/batch_geometry.h"
#include "gradaccum/core/training_state.h"

namespace gradaccum::core {

struct SavedGeometry {
  static constexpr const char* kPiece = "geometry";

  BatchGeometry geometry;
  int64_t window_tokens = 0;  // > 0: windows were measured in tokens (window_plan.h)

  void save(TrainingState& state) const;
  // Checks that the saved b × N × W is one and that the global batch saved with it agrees.
  static SavedGeometry restore(const TrainingState& state);
  // Refuses to continue `state` with `current` and `window_tokens` where the windows would change.
  void check_continues(const TrainingState& state, const BatchGeometry& current, int64_t window_tokens) const;
  // Whether a window saved inside can be continued from its partial sums under `current`: the
  // same b, N and W. Otherwise the window is trained again from its first micro-step, which gives
  // the same step (the saved weights and optimizer are those before the window).
  bool continues_inside_window(const BatchGeometry& current) const;
  // A position that no run with this geometry reaches (an edited trainer_state.json) is refused
  // before it is resumed.
  void check_position_is_possible(const TrainingState& state) const;
};

}  // namespace gradaccum::core
