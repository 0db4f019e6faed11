#include "gradaccum/run/profiler_trace.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <filesystem>
#include <set>

#include "gradaccum/base/files.h"

namespace gradaccum::run {

namespace {
namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;
}  // namespace

ProfilerTrace::ProfilerTrace(int64_t first, int64_t count, std::string path, bool cuda, int64_t resumed_step)
    : first_(first), last_(first + count - 1), path_(std::move(path)), cuda_(cuda), resumed_step_(resumed_step) {}

ProfilerTrace::~ProfilerTrace() {
  // A run that failed mid-trace leaves no trace file, only the profiler switched off.
  if (running_) profiler::disableProfiler();
}

void ProfilerTrace::start() {
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda_) activities.insert(ActivityType::CUDA);
  // With input shapes: a matmul's event names its operands, so the GEMMs of one layer can be
  // told from another's and each one's rate read off (bench/op_profile.py --gemm-shapes).
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  running_ = true;
}

void ProfilerTrace::finish() {
  if (!running_) return;
  running_ = false;
  auto result = profiler::disableProfiler();
  // Written beside its final name and renamed, so the trace file is whole or absent.
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
  base::write_file_atomically_with(path_, [&](const std::string& temporary) { result->save(temporary); });
}

void ProfilerTrace::on_start(const core::RunInfo&) {
  const int64_t next = resumed_step_ < 0 ? 1 : resumed_step_ + 1;
  if (next >= first_ && next <= last_) start();
}

void ProfilerTrace::on_step(const core::StepRecord& r) {
  if (r.step == last_) {
    finish();
  } else if (r.step + 1 == first_) {
    start();
  }
}

void ProfilerTrace::on_end(const core::TrainSummary&) { finish(); }

}  // namespace gradaccum::run
