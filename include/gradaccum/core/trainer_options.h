// What a Trainer is asked to do: the batch geometry, the schedule, the optimizer, the features
// beside the window loop, the device and the precision. Defaults are the library's; the
// configuration's key table (io/config_keys.cpp) fills these fields.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>

#include "gradaccum/core/batch_geometry.h"
#include "gradaccum/core/loss_normalizer.h"
#include "gradaccum/core/mixed_precision.h"
#include "gradaccum/core/window_plan.h"
#include "gradaccum/optim/loss_scaler.h"
#include "gradaccum/optim/lr_schedule.h"
#include "gradaccum/optim/optimizer_factory.h"

namespace gradaccum::core {

// What to do when a window's loss is not finite (fp32: a real divergence).
enum class NanPolicy {
  abort,  // throw, naming the step and the first non-finite micro-step
  skip,   // leave the parameters unchanged, count the step as skipped (costs
          // one extra host synchronization per step, to decide before stepping)
};
const base::EnumNames<NanPolicy>& nan_policy_names();  // "abort" | "skip"

struct TrainerOptions {
  int64_t per_device_train_batch_size = 16;
  int64_t gradient_accumulation_steps = 4;
  int64_t global_batch_size = 0;  // > 0: N is derived as B / (b × W)
  int64_t num_train_epochs = 3;
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
  int64_t per_device_eval_batch_size = 500;
  bool group_by_length = false;                    // sort each window's samples by length (see WindowPlan)
  SampleOrder sample_order = SampleOrder::random;  // train_sampling_strategy
  int64_t save_steps = 0;                          // > 0: a checkpoint every save_steps optimizer steps
  // > 0: also a checkpoint after the first step that ends this long after the last save (save_clock.h)
  double save_interval_s = 0.0;
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

// How a message names an option. The library's names are TrainerOptions' field names, in
// messages "option 'window_tokens'"; the configuration passes its own (io/config.cpp: "key
// 'window_tokens'", and its key where a field is named otherwise), so core never spells a key.
class OptionNames {
 public:
  OptionNames() = default;
  // `keys`: field → the name it has there (fields not in it keep their own); `noun`: what an
  // option is called there.
  OptionNames(std::map<std::string, std::string> keys, std::string noun);
  // The option as the subject of a message: "option 'window_tokens'".
  std::string subject(const std::string& field) const;
  // The option named inside a message: "window_tokens".
  std::string name(const std::string& field) const;

 private:
  std::map<std::string, std::string> keys_;
  std::string noun_ = "option";
};

// Every rule that ties TrainerOptions' fields to each other and to the world size, checked once
// for the library (the Trainer) and for the configuration (io::load_config) alike. Throws
// gradaccum::Error naming the options through `names`.
void validate(const TrainerOptions& options, int64_t world_size, const OptionNames& names = {});

}  // namespace gradaccum::core
