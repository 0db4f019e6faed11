// Console output of a run: a progress bar on a terminal, plain lines otherwise.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include "gradaccum/core/training_observer.h"

namespace gradaccum::run {

class Progress final : public core::TrainingObserver {
 public:
  // `logging_steps`: on a non-terminal, a line every max(logging_steps,
  // total/20) steps, so a default run does not print a line per step. `eval_split` names what the
  // evaluations score in the last line: "test", or "validation" where a test split is held out.
  Progress(FILE* out, bool terminal, int64_t logging_steps, std::string eval_split = "test");

  void on_start(const core::RunInfo& info) override;
  void on_step(const core::StepRecord& record) override;
  void on_eval(const core::EvalRecord& record) override;
  void on_micro_batch_change(const core::MicroBatchChange& change) override;
  void on_end(const core::TrainSummary& summary) override;

 private:
  FILE* out_;
  bool terminal_;
  int64_t logging_steps_;
  std::string eval_split_;
  int64_t interval_ = 1;
  int64_t total_ = 0;
  // The steps this process trained: a resumed run's throughput counts only those (the summary's
  // samples include the checkpoint's).
  int64_t trained_steps_ = 0;
  int64_t trained_samples_ = 0;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace gradaccum::run
