// A whole training run: epochs of windows, evaluation and checkpoints around the window loop.
//
// One optimizer step is WindowRunner::run (window_runner.h), which reads top to bottom; the
// pieces beside it (window_feature.h) are built here from the options, in the order the loop
// calls them: loss scaling, preemption, the gradient accumulator, OOM recovery. The Trainer
// itself walks the plan's windows, keeps the position a checkpoint needs and changes the
// decomposition when OOM recovery asks for a smaller micro-batch.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradaccum/core/batch_geometry.h"
#include "gradaccum/core/deterministic_accumulation.h"
#include "gradaccum/core/grad_sync.h"
#include "gradaccum/core/loss_normalizer.h"
#include "gradaccum/core/loss_scaling.h"
#include "gradaccum/core/oom_recovery.h"
#include "gradaccum/core/preemption.h"
#include "gradaccum/core/save_clock.h"
#include "gradaccum/core/step_sequence.h"
#include "gradaccum/core/stop_agreement.h"
#include "gradaccum/core/trainable.h"
#include "gradaccum/core/trainer_options.h"
#include "gradaccum/core/training_observer.h"
#include "gradaccum/core/training_state.h"
#include "gradaccum/core/window_plan.h"
#include "gradaccum/core/window_runner.h"
#include "gradaccum/optim/optimizer_state.h"

namespace gradaccum::core {

// Total optimizer steps: max_steps, or epochs × windows per epoch.
int64_t total_optimizer_steps(const TrainerOptions& options, const WindowPlan& plan);

// Moves `module` to `device` and its floating-point tensors to `dtype`, as Module::to does, except
// frozen parameters (requires_grad false) held in 16 bits: a model that keeps its frozen weights in
// bfloat16 to save memory (a frozen base under trained adapters) keeps them so.
void place_module(torch::nn::Module& module, const torch::Device& device, torch::ScalarType dtype);

class Trainer {
 public:
  // Moves the model to options.device/dtype (place_module) and builds the optimizer from
  // options.optimizer, unless `optimizer` is given (e.g. a sharded one, built
  // over the model's trainable parameters after the move).
  // `eval_data` may be null; `sync` null means one process. Every rank passes the same eval_data
  // (or null): rank 0 evaluates it, the others take part in gathering sharded parameters.
  Trainer(TrainerOptions options, Trainable& model, const Dataset& train_data, const Dataset* eval_data,
          TrainingObserver& observer, GradSync* sync = nullptr,
          std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr);
  Trainer(const Trainer&) = delete;  // the pieces hold references into it
  Trainer& operator=(const Trainer&) = delete;

  // Continue a saved run (call before run()): any decomposition of the same
  // global batch. A state saved inside a window continues from its partial
  // sums under the same b, N and W, and otherwise trains that window again
  // from its first micro-step.
  void restore(const TrainingState& state);

  // Checkpoints: `hook` is called every options.save_steps steps, after the first step that ends
  // options.save_interval_s seconds after the last save (save_clock.h), at the end,
  // and when `*stop` becomes true (SIGTERM/SIGINT). The loop then stops after
  // the micro-step in flight and saves the partial window, where `agreement`
  // allows it (stop_agreement.h; null: the one-process agreement, or with
  // several ranks none, so they stop at the window's end). A stop that cannot
  // happen inside the window happens at its end: the flag travels with the
  // loss totals, so it costs no extra collective.
  void set_checkpointing(CheckpointHook* hook, const std::atomic<bool>* stop, StopAgreement* agreement = nullptr);

  TrainSummary run();

  // One optimizer step over `window` (exposed for tests).
  StepRecord train_window(const Window& window);

  const WindowPlan& plan() const { return plan_; }
  int64_t total_steps() const { return total_steps_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  // The parameters the optimizer steps under the module's names: the keys of its state in a
  // checkpoint (optim/optimizer_state.h).
  optim::NamedParameters named_parameters() const;

 private:
  // The state a checkpoint at `position` holds: the loop's and every piece's.
  TrainingState state_at(const TrainingPosition& position) const;
  // eval_data_ evaluated by rank 0 (nullopt elsewhere) with the parameters whole.
  std::optional<EvalRecord> evaluate_on_rank0();
  // The decomposition in use: the plan's, smaller than the options' after an OOM.
  void use_geometry(const BatchGeometry& geometry);

  TrainerOptions options_;
  Trainable& model_;
  const Dataset& train_data_;
  const Dataset* eval_data_;
  TrainingObserver& observer_;
  LocalGradSync local_sync_;
  GradSync& sync_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> param_names_;  // params_'s module names
  WindowPlan plan_;
  int64_t total_steps_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  LossNormalizer normalizer_;
  // The pieces beside the window loop, in the order it calls them.
  std::optional<LossScaling> loss_scaling_;
  std::optional<Preemption> preemption_;
  std::unique_ptr<GradAccumulator> accumulator_;  // plain, or deterministic_accumulation's tree
  std::optional<OomRecovery> oom_recovery_;
  std::optional<SaveClock> save_clock_;
  std::vector<WindowFeature*> pieces_;  // the five above
  std::unique_ptr<StepSequence> steps_;
  std::unique_ptr<WindowRunner> runner_;
  TrainingPosition position_;
  CheckpointHook* hook_ = nullptr;
  LocalStopAgreement local_stop_;
};

}  // namespace gradaccum::core
