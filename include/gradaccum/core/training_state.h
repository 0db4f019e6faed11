// Where a run is, in the terms a resumed run needs: the loop's position in the
// data and the step count, and — when a run was preempted inside a window — the
// partially accumulated window itself. Model weights and optimizer state are
// not here: they belong to the model and the optimizer, which save themselves.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "gradaccum/optim/loss_scaler.h"

namespace gradaccum::core {

struct TrainingPosition {
  int64_t step = 0;           // optimizer steps completed (windows consumed)
  int64_t schedule_step = 0;  // the LR schedule's position: step minus fp16 overflow skips
  int64_t epoch = 0;          // epoch of the next window
  int64_t window = 0;         // index of the next window within its epoch (last_window: carry: from the run's start)
  int64_t micro_step = 0;     // > 0: micro-steps of that window already accumulated
  // Running figures for the summary of a run that spans several processes.
  double loss_total = 0.0;  // Σ window losses
  int64_t samples = 0;
  int64_t items = 0;
};

// A window interrupted after `position.micro_step` micro-steps: the gradient
// sums so far and the normalizer's running [Σ sum, Σ count, Σ naive]. Resuming
// puts both back and runs the remaining micro-steps: the same additions in the
// same order, so the window's result is bit-identical.
struct PartialWindow {
  torch::Tensor totals;  // float64 [3]
  // float64 [micro-steps done]: each micro-step's item count, for the window's record
  // (undefined in a checkpoint written before it was saved: the record then leaves them out).
  torch::Tensor micro_items;
  std::vector<torch::Tensor> grads;  // per trainable parameter; undefined = no gradient yet
};

struct TrainingState {
  TrainingPosition position;
  PartialWindow partial;  // empty unless position.micro_step > 0
  // Grad accumulation geometry the state was made with; a partial window can
  // only be continued by the same b, N and W.
  int64_t micro_batch = 0;
  int64_t accumulation_steps = 0;
  int64_t world_size = 0;
  int64_t global_batch = 0;
  int64_t window_tokens = 0;  // > 0: windows were measured in tokens (window_plan.h)
  // The micro-batch is smaller than configured because a window ran out of memory
  // (out_of_memory.h): a resumed run keeps it instead of running out of memory again.
  bool micro_batch_from_oom_recovery = false;
  std::optional<optim::LossScalerState> loss_scaler;  // fp16 runs only
};

enum class SaveReason { periodic, final, preempted };

// Called by the loop when a checkpoint is due. The implementation (io/) owns the
// format; it reaches the model and the optimizer through its own references.
class CheckpointHook {
 public:
  virtual ~CheckpointHook() = default;
  virtual void save(const TrainingState& state, SaveReason reason) = 0;
};

}  // namespace gradaccum::core
