// What the training loop reports, and to whom: metrics files, progress bars and
// tests observe a run through this interface; the loop never formats output.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gradaccum/core/batch_geometry.h"

namespace gradaccum::core {

struct RunInfo {
  BatchGeometry geometry;
  int64_t total_steps = 0;
  int64_t windows_per_epoch = 0;
  int64_t train_samples = 0;
  int64_t eval_samples = 0;
  int64_t parameters = 0;
};

// One optimizer step. Figures are global (all micro-steps, all ranks).
struct StepRecord {
  int64_t step = 0;   // 1-based count of optimizer steps taken
  int64_t epoch = 0;  // 0-based epoch this window belongs to
  double loss = 0.0;  // Σ loss sums / Σ counts over the window (the exact window mean)
  double lr = 0.0;
  double grad_norm = 0.0;          // before clipping
  double grad_norm_clipped = 0.0;  // after clipping
  double weight_norm = 0.0;        // after the update
  int64_t items = 0;               // Σ counts: samples, elements or tokens
  // The window's accounting: each micro-step's item count summed over ranks (empty when a
  // resumed window's checkpoint did not hold them), each rank's Σ counts (world size > 1),
  // and the normalization that divided the window's gradient ("window", "sum", "micro_batch").
  std::vector<int64_t> micro_step_items;
  std::vector<int64_t> rank_items;
  std::string loss_normalization;
  int64_t samples = 0;
  int64_t micro_steps = 0;
  int64_t micro_batch_size = 0;             // b in use (smaller than configured after an OOM)
  int64_t gradient_accumulation_steps = 0;  // N in use
  int64_t padded_tokens = 0;                // the window's micro-batches as padded (0: samples without length)
  int64_t sample_tokens = 0;                // the tokens its samples hold
  bool skipped = false;                     // parameters not updated (non-finite loss, or fp16 overflow)
  double loss_scale = 0.0;                  // fp16: the loss scale of this window; 0 otherwise
  double time_s = 0.0;                      // since the start of training
  double step_time_s = 0.0;                 // this window, data included
  double data_time_s = 0.0;                 // of which fetching and moving batches
  double samples_per_s = 0.0;
  double items_per_s = 0.0;
  int64_t world_size = 1;
  int64_t allreduce_calls = 0;  // gradient all-reduces in this window (data parallel)
  int64_t allreduce_bytes = 0;
  int64_t all_gather_calls = 0;  // ZeRO-3: parameter all-gathers in this window
  // ZeRO-2: how this window's gradients were reduce-scattered ("defer" | "each_micro_step");
  // allreduce_calls and allreduce_bytes then count those reduce-scatters.
  std::string sharded_grad_sync;
};

// The gradient flow of one optimizer step (core/grad_flow.h): per parameter tensor, in
// registration order, the mean and largest |g| of the window's final gradient (normalized,
// before clipping) and its fraction of exact zeros.
struct GradFlowRecord {
  int64_t step = 0;                // the optimizer step whose gradient this is (1-based)
  std::vector<std::string> names;  // the parameters' module names
  std::vector<double> mean_abs, max_abs, zero_fraction;
};

// A window ran out of memory and is trained again with a smaller micro-batch (out_of_memory.h).
struct MicroBatchChange {
  int64_t step = 0;  // the optimizer step the window becomes
  int64_t from_micro_batch = 0, from_accumulation = 0;
  int64_t to_micro_batch = 0, to_accumulation = 0;
  int64_t requested_bytes = 0;  // the failed allocation on this rank (0: unknown or another rank's)
};

struct EvalRecord {
  int64_t step = 0;
  double loss = 0.0;
  double accuracy = std::numeric_limits<double>::quiet_NaN();  // NaN: not a classifier
  int64_t samples = 0;
  int64_t items = 0;
  double time_s = 0.0;
};

struct TrainSummary {
  int64_t steps = 0;
  int64_t samples = 0;
  int64_t items = 0;
  double wall_s = 0.0;
  double train_loss = 0.0;     // mean of the per-step window losses
  double final_loss = 0.0;     // the last window's loss
  double samples_per_s = 0.0;  // of the samples this run trained (a resumed run's earlier ones took no time here)
  double items_per_s = 0.0;
  bool has_eval = false;
  EvalRecord eval;
  bool preempted = false;  // stopped early by a stop request, after saving
};

class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  virtual void on_start(const RunInfo&) {}
  virtual void on_step(const StepRecord&) {}
  virtual void on_eval(const EvalRecord&) {}
  // Every grad_flow_steps optimizer steps (TrainerOptions), before that step's on_step.
  virtual void on_grad_flow(const GradFlowRecord&) {}
  // Before the window that ran out of memory is trained again.
  virtual void on_micro_batch_change(const MicroBatchChange&) {}
  virtual void on_end(const TrainSummary&) {}
};

}  // namespace gradaccum::core

namespace gradaccum::core {

// Forwards every event to several observers, in order.
class ObserverList final : public TrainingObserver {
 public:
  void add(TrainingObserver& observer) { observers_.push_back(&observer); }
  void on_start(const RunInfo& i) override {
    for (auto* o : observers_) o->on_start(i);
  }
  void on_step(const StepRecord& r) override {
    for (auto* o : observers_) o->on_step(r);
  }
  void on_eval(const EvalRecord& r) override {
    for (auto* o : observers_) o->on_eval(r);
  }
  void on_grad_flow(const GradFlowRecord& r) override {
    for (auto* o : observers_) o->on_grad_flow(r);
  }
  void on_micro_batch_change(const MicroBatchChange& c) override {
    for (auto* o : observers_) o->on_micro_batch_change(c);
  }
  void on_end(const TrainSummary& s) override {
    for (auto* o : observers_) o->on_end(s);
  }

 private:
  std::vector<TrainingObserver*> observers_;
};

}  // namespace gradaccum::core
