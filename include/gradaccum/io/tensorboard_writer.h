// Training curves as TensorBoard scalars (`report_to: tensorboard`): one event file in
// `logging_dir`, written by rank 0 at each logged optimizer step (every logging_steps and the
// last), flushed at least every 10 s, at every evaluation and at the end.
//
// Tags, each the metrics.jsonl field of the same name (metrics_writer.h):
//   train/loss, train/lr, train/grad_norm (before clipping), train/grad_norm_clipped,
//   train/weight_norm, train/items (the window's normalizer: tokens or samples),
//   train/tokens_per_s (language models) or train/samples_per_s, train/epoch,
//   train/loss_scale (fp16 only), train/micro_step_items_min and _max (the window's smallest
//   and largest micro-step, in items);
//   eval/loss, eval/accuracy (classifiers), eval/items;
// and at every gradient-flow record (grad_flow_steps) grad_flow/<parameter>/mean_abs, max_abs
// and zero_fraction, plus the histogram grad_flow/mean_abs_across_parameters.
// Values that are not finite (the gradient norm of a step skipped after an fp16 overflow) are
// left out, as metrics.jsonl writes them as null.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "gradaccum/core/training_observer.h"
#include "gradaccum/formats/event_file.h"

namespace gradaccum::io {

class TensorBoardWriter final : public core::TrainingObserver {
 public:
  // Creates the event file now, so that an unusable `logging_dir` fails before training
  // (gradaccum::Error naming it).
  TensorBoardWriter(const std::string& logging_dir, bool items_are_tokens, int64_t logging_steps);

  void on_start(const core::RunInfo& info) override;
  void on_step(const core::StepRecord& record) override;
  void on_eval(const core::EvalRecord& record) override;
  void on_grad_flow(const core::GradFlowRecord& record) override;
  void on_end(const core::TrainSummary& summary) override;

  const std::string& path() const { return file_.path(); }

 private:
  void write(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

  formats::EventFile file_;
  bool items_are_tokens_;
  int64_t logging_steps_;
  int64_t total_steps_ = 0;
  std::chrono::steady_clock::time_point last_flush_ = std::chrono::steady_clock::now();
};

}  // namespace gradaccum::io
