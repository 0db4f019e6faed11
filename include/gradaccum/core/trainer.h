// The accumulation loop. One optimizer step is one visible loop over the
// window's micro-steps (Trainer::train_window): fetch, forward, backward, with
// gradient communication allowed only on the last micro-step; then the exact
// normalization and the step sequence.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "gradaccum/core/batch_geometry.h"
#include "gradaccum/core/grad_sync.h"
#include "gradaccum/core/loss_normalizer.h"
#include "gradaccum/core/mixed_precision.h"
#include "gradaccum/core/out_of_memory.h"
#include "gradaccum/core/step_sequence.h"
#include "gradaccum/core/stop_agreement.h"
#include "gradaccum/core/trainable.h"
#include "gradaccum/core/training_observer.h"
#include "gradaccum/core/training_state.h"
#include "gradaccum/core/window_plan.h"
#include "gradaccum/optim/loss_scaler.h"
#include "gradaccum/optim/lr_schedule.h"
#include "gradaccum/optim/optimizer_factory.h"
#include "gradaccum/optim/optimizer_state.h"

namespace gradaccum::core {

// What to do when a window's loss is not finite (fp32: a real divergence).
enum class NanPolicy {
  abort,  // throw, naming the step and the first non-finite micro-step
  skip,   // leave the parameters unchanged, count the step as skipped (costs
          // one extra host synchronization per step, to decide before stepping)
};

struct TrainerOptions {
  int64_t per_device_train_batch_size = 16;
  int64_t gradient_accumulation_steps = 4;
  int64_t global_batch_size = 0;  // > 0: N is derived as B / (b × W)
  int64_t num_train_epochs = 1;
  int64_t max_steps = 0;  // > 0 overrides num_train_epochs
  optim::OptimizerSpec optimizer;
  optim::ScheduleType lr_scheduler_type = optim::ScheduleType::cosine;
  int64_t warmup_steps = 0;
  double warmup_ratio = 0.0;   // used when warmup_steps == 0
  double max_grad_norm = 1.0;  // <= 0 disables clipping
  LossNormalization loss_normalization = LossNormalization::window;
  LastWindow last_window = LastWindow::partial;
  uint64_t seed = 42;
  int64_t eval_steps = 0;       // 0: evaluate at the end only
  int64_t grad_flow_steps = 0;  // > 0: gradient flow every K optimizer steps (grad_flow.h)
  int64_t per_device_eval_batch_size = 256;
  bool group_by_length = false;                    // sort each window's samples by length (see WindowPlan)
  SampleOrder sample_order = SampleOrder::random;  // train_sampling_strategy
  int64_t save_steps = 0;                          // > 0: a checkpoint every save_steps optimizer steps
  NanPolicy nan_policy = NanPolicy::abort;
  // For a fixed micro-batch size, gradients and losses bit-identical for every N × W with W a
  // power of two (canonical_sum.h): chunks in contiguous order, each micro-batch's gradient kept
  // apart and added in the canonical tree, ranks reduced in the same tree. A stop request waits
  // for the window's end (the tree's partial sums are not checkpointed).
  bool deterministic_accumulation = false;
  // A window whose micro-step runs out of memory is trained again with half the micro-batch and
  // twice the micro-steps (out_of_memory.h). With several ranks, the ranks learn of it from the
  // window's totals: one more device-to-host read per optimizer step on a GPU.
  bool oom_recovery = true;
  // > 0: each window's samples are cut into micro-batches of at most this many padded tokens
  // instead of b rows (WindowPlan::set_token_budget): N varies per window, memory follows K.
  int64_t max_tokens_per_micro_batch = 0;
  // > 0: a window closes where its samples' items (a language model's targets) reach this many,
  // and its gradient is normalized by its own count (WindowPlan::set_window_tokens). Micro-batches
  // hold b samples (or follow max_tokens_per_micro_batch) and their number follows the window;
  // gradient_accumulation_steps is unused (taken as 1) and global_batch_size must be 0. The LR
  // schedule counts these windows.
  int64_t window_tokens = 0;
  torch::ScalarType dtype = torch::kFloat;
  torch::Device device = torch::kCPU;
  // bf16 / fp16 autocast of the forward and the loss (mixed_precision.h);
  // needs dtype float32. fp16 adds the dynamic loss scaler.
  MixedPrecision mixed_precision = MixedPrecision::none;
  optim::LossScalerOptions loss_scaler;

  // b × N × W from the options (derives N when global_batch_size is set).
  BatchGeometry geometry(int64_t world_size) const;
};

// Total optimizer steps: max_steps, or epochs × windows per epoch.
int64_t total_optimizer_steps(const TrainerOptions& options, const WindowPlan& plan);

class Trainer {
 public:
  // Moves the model to options.device/dtype and builds the optimizer from
  // options.optimizer, unless `optimizer` is given (e.g. a sharded one, built
  // over the model's trainable parameters after the move).
  // `eval_data` may be null; `sync` null means one process.
  Trainer(TrainerOptions options, Trainable& model, const Dataset& train_data, const Dataset* eval_data,
          TrainingObserver& observer, GradSync* sync = nullptr,
          std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr);

  // Continue a saved run (call before run()). A state saved inside a window
  // needs the same b, N and W; a state between windows any decomposition of
  // the same global batch.
  void restore(const TrainingState& state);

  // Checkpoints: `hook` is called every options.save_steps steps, at the end,
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
  // The micro-batch of `indices` on the training device, keyed for optimizer step `step`.
  core::Batch fetch(const torch::Tensor& indices, int64_t step) const;
  // Runs micro-steps [first, N) of `window`; nullopt when a stop request ended
  // it early (then *partial holds the accumulated state).
  std::optional<StepRecord> run_window(const Window& window, int64_t first_micro_step, PartialWindow* partial);
  // The pieces of run_window, in its order (trainer.cpp).
  struct WindowSums;    // one window's running state on this rank
  struct WindowTotals;  // what the window's all-reduce carried
  void begin_window(WindowSums& sums);
  bool stop_inside_window(const WindowSums& sums, int64_t window_id, int64_t s, bool last, PartialWindow* partial);
  void run_micro_step(const Window& window, int64_t s, int64_t window_id, WindowSums& sums);
  WindowTotals reduce_window(const Window& window, WindowSums& sums);
  void throw_if_any_rank_ran_out_of_memory(const WindowTotals& totals, WindowSums& sums);
  StepRecord make_record(const Window& window, const WindowTotals& totals, const WindowSums& sums,
                         const WindowLoss& window_loss, const StepResult& step, bool skip,
                         const torch::Tensor& flow_statistics);
  TrainingState state_at(const TrainingPosition& position) const;
  bool stop_requested() const { return stop_ != nullptr && stop_->load(); }

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
  std::optional<optim::LossScaler> scaler_;  // fp16 only
  // fp16: each micro-step's loss sum is multiplied by scale / fp16_items_,
  // with fp16_items_ a power of two near a micro-batch's item count, so the
  // scaled gradients have the magnitude a mean loss times the scale would give
  // (a sum over thousands of tokens times 65536 would overflow at once).
  // Powers of two keep the unscale exact.
  double fp16_items_ = 1.0;
  std::unique_ptr<StepSequence> steps_;
  TrainingPosition position_;
  PartialWindow resume_partial_;
  CheckpointHook* hook_ = nullptr;
  const std::atomic<bool>* stop_ = nullptr;
  LocalStopAgreement local_stop_;
  StopAgreement* agreement_ = nullptr;  // null: no stop inside a window
  bool stop_agreed_ = false;            // set by a window whose all-reduced stop flag was raised
  int64_t stopped_after_ = 0;           // micro-steps done when run_window stopped early
  // deterministic_accumulation: this micro-step's gradients, taken out of .grad (which is then
  // empty for the next micro-step's backward).
  std::vector<torch::Tensor> take_gradients();
  // After a window ran out of memory: continues with a smaller micro-batch (out_of_memory.h),
  // or throws gradaccum::Error when it is 1 already.
  void shrink_micro_batch(const WindowOutOfMemory& oom, int64_t step);
  // The decomposition in use: the plan's, smaller than the options' after an OOM.
  void use_geometry(const BatchGeometry& geometry);
  bool micro_batch_from_oom_recovery_ = false;
};

}  // namespace gradaccum::core
