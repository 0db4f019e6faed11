// What a run does around the Trainer: where it writes, how it logs, checkpoints and resumes, how
// its ranks meet, how the process computes. The library's run::RunOptions holds these beside the
// trainer's options, and the configuration's key table (config_keys.cpp) stores into these very
// fields, so each option has one default, here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gradaccum/core/mixed_precision.h"
#include "gradaccum/dist/grad_shard_policy.h"

namespace gradaccum::io {

struct RunSettings {
  std::string output_dir = "runs/default";
  int64_t threads = 0;                 // 0: this host's cores shared among its ranks
  std::string custom_kernels = "all";  // kernels/custom_kernels.h
  core::Bf16CpuMatmuls bf16_cpu_matmuls = core::Bf16CpuMatmuls::automatic;  // core/mixed_precision.h
  int64_t logging_steps = 1;                                                // console and TensorBoard interval
  std::vector<std::string> report_to;  // "tensorboard" (HF's key): event files in logging_dir
  std::string logging_dir;             // "" = output_dir/runs
  // "" | "latest" (under output_dir) | "auto" (latest if output_dir's run has one, else a fresh
  // start: what a worker that torchrun restarts needs) | a checkpoint directory
  std::string resume_from_checkpoint;
  bool overwrite_output_dir = false;  // a fresh run may start in an output_dir holding checkpoints
  bool allow_batch_change = false;    // resume with another global batch (not exact)
  int64_t save_total_limit = 0;       // > 0: keep the newest K checkpoints
  // save_on_error: continue. A checkpoint that cannot be written (disk full) is reported
  // and training goes on; false (stop): the run stops with that error. Earlier checkpoints stay.
  bool continue_after_failed_save = false;
  int64_t dist_timeout_s = 60;  // a stalled rank is an error after this long
  // > 0: libtorch's profiler over optimizer steps K..K+profile_steps-1, each rank's operators
  // written as a Chrome trace to output_dir/profiler/trace-rank<R>.json.
  int64_t profile_from_step = 0;
  int64_t profile_steps = 3;
  int64_t ddp_bucket_cap_mb = 25;     // gradient all-reduce buckets
  bool sync_each_micro_step = false;  // all-reduce every micro-step (comparison only)
  int64_t zero_stage = 0;  // 1: optimizer state sharded across ranks; 2: and the gradients; 3: and the parameters
  dist::GradShardPolicy sharded_grad_sync = dist::GradShardPolicy::automatic;  // zero_stage 2 and 3

  bool reports_to(const std::string& name) const {
    return std::find(report_to.begin(), report_to.end(), name) != report_to.end();
  }
};

}  // namespace gradaccum::io
