#include "gradaccum/run/process_setup.h"

#include <ATen/Parallel.h>

#include "gradaccum/kernels/cpu_and_blas.h"
#include "gradaccum/kernels/custom_kernels.h"
#include "gradaccum/kernels/float32_cpu_matmuls.h"
#include "gradaccum/kernels/heap_retention.h"
#include "gradaccum/run/runtime.h"

namespace gradaccum::run {

ProcessSettings training_process_settings(const io::RunSettings& settings, const core::TrainerOptions& trainer,
                                          int64_t local_ranks) {
  ProcessSettings process;
  process.threads = settings.threads;
  process.local_ranks = local_ranks;
  process.custom_kernels = settings.custom_kernels;
  process.cpu_matmuls_through_float32 =
      routes_cpu_matmuls_through_float32(settings.bf16_cpu_matmuls, trainer.mixed_precision, trainer.device,
                                         kernels::cpu_has_native_bf16(), kernels::cpu_has_native_fp16());
  // Keep the memory a step frees for the next step instead of re-faulting it (heap_retention.h),
  // except under ZeRO-3, whose point is memory: there the retained heap kept the whole parameters
  // every rank built before sharding them and each step's transients (the Qwen2.5-0.5B shape at
  // W = 2: 8.9 GB a rank with it, as much as stage 0; 5.8 GB without, bench/dist/zero3_memory.sh).
  process.retain_freed_heap = settings.zero_stage != 3;
  return process;
}

ProcessSetup::ProcessSetup(const ProcessSettings& settings)
    : settings_(settings),
      previous_threads_(at::get_num_threads()),
      previous_kernels_(kernels::custom_kernels_description()),
      previous_route_(kernels::cpu_autocast_matmuls_route_through_float32()) {
  kernels::set_custom_kernels(settings_.custom_kernels);  // first: the one step that can refuse
  threads_ = configure_threads(settings_.threads, settings_.local_ranks);
  if (settings_.retain_freed_heap) kernels::retain_freed_heap();
  kernels::route_cpu_autocast_matmuls_through_float32(settings_.cpu_matmuls_through_float32);
}

ProcessSetup::~ProcessSetup() {
  kernels::route_cpu_autocast_matmuls_through_float32(previous_route_);
  kernels::set_custom_kernels(previous_kernels_);
  at::set_num_threads(previous_threads_);
}

}  // namespace gradaccum::run
