// What a run sets in its process, set by the program that runs it.
//
// libtorch's intra-op threads, the custom-kernel switch (kernels/custom_kernels.h) and how CPU
// autocast multiplies (kernels/float32_cpu_matmuls.h) are process-wide. A ProcessSetup applies
// one run's settings when it is made and puts back what was there when it ends. A program makes
// one before it loads its data (which uses the threads) and keeps it while run::fit trains; fit
// makes one of its own, for the call, when given none. So two runs in one process with different
// settings each get their own, and the process is as before after each.
//
// Scoped by the caller rather than set by fit: the data loading and model building before fit
// run under the same threads and kernels as the training, and nothing is set behind the caller's
// back. (fit scopes the SIGTERM / SIGINT handlers itself, run/stop_signals.h: they belong to the
// training loop, and a signal during data loading should still end the program.)
//
// Kept for the rest of the process, whatever the scope:
//   - freed-heap retention (kernels/heap_retention.h): glibc cannot report the thresholds it
//     replaces, and it changes where memory comes from, never a result;
//   - MKL's code path (kernels/mkl_intel_path.h): MKL keeps its first answer;
//   - the dispatcher entries of the float32 route: installed once; switched off they run
//     libtorch's own autocast path.
//
// Usage:
//   run::ProcessSetup setup(run::training_process_settings(options, options.trainer, env.local_world_size));
//   ... load the data, build the model ...
//   run::fit(options, model, data, nullptr, {}, nullptr, &setup, env);
#pragma once

#include <cstdint>
#include <string>

#include "gradaccum/core/trainer_options.h"
#include "gradaccum/io/run_settings.h"

namespace gradaccum::run {

struct ProcessSettings {
  int64_t threads = 0;                       // libtorch's intra-op threads; 0: the host's cores / local_ranks
  int64_t local_ranks = 1;                   // the job's processes on this host, sharing its cores
  std::string custom_kernels = "all";        // the switch's spec (kernels/custom_kernels.h)
  bool cpu_matmuls_through_float32 = false;  // CPU autocast's matmuls routed (kernels/float32_cpu_matmuls.h)
  bool retain_freed_heap = false;            // kernels/heap_retention.h, where custom_kernels has it
};

// What a training run's keys ask for: `threads`, `custom_kernels`, the float32 route as
// bf16_cpu_matmuls, mixed_precision, the device and this CPU decide it
// (run/runtime.h, routes_cpu_matmuls_through_float32), and the freed heap kept.
ProcessSettings training_process_settings(const io::RunSettings& settings, const core::TrainerOptions& trainer,
                                          int64_t local_ranks);

class ProcessSetup {
 public:
  // Applies `settings`; throws gradaccum::Error naming a bad custom_kernels spec, changing nothing.
  explicit ProcessSetup(const ProcessSettings& settings);
  // Puts back the threads, the kernel switch and the route as they were.
  ~ProcessSetup();
  ProcessSetup(const ProcessSetup&) = delete;
  ProcessSetup& operator=(const ProcessSetup&) = delete;

  const ProcessSettings& settings() const { return settings_; }
  int threads() const { return threads_; }  // the count set

 private:
  ProcessSettings settings_;
  int threads_ = 0;
  int previous_threads_ = 0;
  std::string previous_kernels_;
  bool previous_route_ = false;
};

}  // namespace gradaccum::run
