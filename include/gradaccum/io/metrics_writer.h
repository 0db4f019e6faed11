// metrics.jsonl (one JSON object per optimizer step, plus `eval_` records) and
// summary.json in the output directory (DESIGN.md §3).
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "gradaccum/core/training_observer.h"

namespace gradaccum::io {

class MetricsWriter final : public core::TrainingObserver {
 public:
  // `items_are_tokens`: report items_per_s as tokens_per_s as well.
  // `resumed_at_step` >= 0: a resumed run; keeps the existing lines up to that
  // step and appends, so the file reads as one uninterrupted run.
  MetricsWriter(const std::string& output_dir, bool items_are_tokens = false, int64_t resumed_at_step = -1);

  void on_start(const core::RunInfo& info) override;
  void on_step(const core::StepRecord& record) override;
  void on_eval(const core::EvalRecord& record) override;
  void on_end(const core::TrainSummary& summary) override;

  static nlohmann::json to_json(const core::StepRecord& record, bool items_are_tokens);
  static nlohmann::json to_json(const core::EvalRecord& record);

 private:
  void write_line(const nlohmann::json& line);

  std::string output_dir_;
  bool items_are_tokens_;
  std::ofstream metrics_;
  core::RunInfo info_{core::BatchGeometry::from_accumulation(1, 1)};
  int64_t last_micro_batch_ = 0, last_accumulation_ = 0;  // of the last step written
};

// Writes `text` to `path` through a temporary file and a rename, so a reader
// never sees a half-written file.
void write_file_atomically(const std::string& path, const std::string& text);

// Opens the JSON-lines log `path` whose lines carry a "step": truncated for a new run; for a
// run resumed at `resumed_at_step` (>= 0), keeping the lines up to that step and appending, so
// the file reads as one uninterrupted run. Throws gradaccum::Error when it cannot be written.
void open_step_log(std::ofstream& out, const std::string& path, int64_t resumed_at_step);

}  // namespace gradaccum::io
