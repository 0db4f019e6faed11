// One optimizer step: the window's micro-steps and what follows them, in the order DESIGN.md §1
// fixes, on one screen (window_runner.cpp):
//
//   for each micro-step: fetch → forward → backward of the loss *sum*
//                        (gradient communication starts only inside the last backward)
//   sync: the gradients and the window's totals summed over ranks in one all-reduce
//   normalize once: every gradient divided by the window's global item count
//   step: (fp16 inf check) → clip → optimizer step → zero grads → schedule
//
// Everything else is a WindowFeature beside it (window_feature.h): preemption inside a window,
// OOM recovery, deterministic accumulation, loss scaling. The runner knows a model only as a
// Trainable (its loss as a sum and a count) and the ranks only through GradSync.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "gradaccum/core/grad_sync.h"
#include "gradaccum/core/loss_normalizer.h"
#include "gradaccum/core/step_sequence.h"
#include "gradaccum/core/trainable.h"
#include "gradaccum/core/trainer_options.h"
#include "gradaccum/core/training_observer.h"
#include "gradaccum/core/window_feature.h"
#include "gradaccum/core/window_plan.h"

namespace gradaccum::core {

class WindowRunner {
 public:
  // Every reference must outlive the runner. `accumulator` is also one of `features`.
  WindowRunner(const TrainerOptions& options, Trainable& model, const Dataset& data, GradSync& sync,
               const WindowPlan& plan, std::vector<torch::Tensor> params, std::vector<std::string> param_names,
               LossNormalizer& normalizer, StepSequence& steps, GradAccumulator& accumulator,
               std::vector<WindowFeature*> features, TrainingObserver& observer);

  // Runs micro-steps [first_micro_step, N) of `window` and its optimizer step. nullopt when a
  // feature stopped the window between micro-steps (`stoppable`: the caller can save it).
  std::optional<StepRecord> run(const Window& window, int64_t first_micro_step, bool stoppable);

 private:
  void micro_step(WindowState& w, int64_t s);
  WindowTotals reduce(WindowState& w);
  // The step's record from its one host read (step_record.cpp).
  StepRecord make_record(const WindowState& w, const WindowTotals& totals, const WindowLoss& window_loss,
                         const StepResult& step, bool skip, const torch::Tensor& flow_statistics);
  // The micro-batch of `indices` on the training device, keyed for optimizer step `step`.
  Batch fetch(const torch::Tensor& indices, int64_t step) const;

  const TrainerOptions& options_;
  Trainable& model_;
  const Dataset& data_;
  GradSync& sync_;
  const WindowPlan& plan_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> param_names_;
  LossNormalizer& normalizer_;
  StepSequence& steps_;
  GradAccumulator& accumulator_;
  std::vector<WindowFeature*> features_;
  TrainingObserver& observer_;
};

}  // namespace gradaccum::core
