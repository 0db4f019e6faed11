// libtorch's profiler over a few optimizer steps of a run (keys profile_from_step and
// profile_steps): every operator the steps call, with its thread and time, written as a Chrome
// trace (the format of torch.profiler's export_chrome_trace) that Perfetto or chrome://tracing
// opens and bench/op_profile.py summarizes operator by operator.
#pragma once

#include <cstdint>
#include <string>

#include "gradaccum/core/training_observer.h"

namespace gradaccum::run {

class ProfilerTrace final : public core::TrainingObserver {
 public:
  // Traces optimizer steps first..first+count-1 (1-based) into `path`; a run that resumes past
  // `first` starts at its first step, one that ends before the last writes what it traced.
  // `cuda`: the device's kernels too (Kineto's CUDA activity), not only the CPU operators.
  ProfilerTrace(int64_t first, int64_t count, std::string path, bool cuda, int64_t resumed_step);
  ~ProfilerTrace() override;

  void on_start(const core::RunInfo& info) override;
  void on_step(const core::StepRecord& record) override;
  void on_end(const core::TrainSummary& summary) override;

  const std::string& path() const { return path_; }
  int64_t last_step() const { return last_; }

 private:
  void start();
  void finish();

  int64_t first_, last_;
  std::string path_;
  bool cuda_;
  int64_t resumed_step_;
  bool running_ = false;
};

}  // namespace gradaccum::run
