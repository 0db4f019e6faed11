// grad_flow.jsonl in the output directory: one line per gradient-flow record (core/grad_flow.h),
//   {"step": S, "parameters": [{"name": "...", "mean_abs": m, "max_abs": M, "zero_fraction": z}, ...]}
// with the parameters in registration order (input to output, the x axis of seed 002's chart).
#pragma once

#include <string>

#include "gradaccum/core/training_observer.h"
#include "gradaccum/io/metrics_writer.h"

namespace gradaccum::io {

class GradFlowWriter final : public core::TrainingObserver {
 public:
  // `resumed_at_step` as MetricsWriter's.
  explicit GradFlowWriter(const std::string& output_dir, int64_t resumed_at_step = -1);

  void on_grad_flow(const core::GradFlowRecord& record) override;

 private:
  RecordLog out_;
};

}  // namespace gradaccum::io
