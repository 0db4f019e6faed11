// metrics.jsonl (one JSON object per optimizer step, plus `eval_` records) and
// summary.json in the output directory (DESIGN.md §3).
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>
#include <string>

#include "gradaccum/core/training_observer.h"

namespace gradaccum::io {

// A JSON-lines log whose lines carry a "step" (metrics.jsonl, grad_flow.jsonl), written a whole
// record at a time: each line is one checked write to the file; a write that fails, also part-way,
// is cut back so that the file ends after the last whole record, and throws gradaccum::Error
// naming the file and the cause (a full disk stops the run instead of losing its records).
class RecordLog {
 public:
  // Truncated for a new run; for a run resumed at `resumed_at_step` (>= 0), the lines up to that
  // step are kept and the log continues after them, so the file reads as one uninterrupted run.
  RecordLog(std::string path, int64_t resumed_at_step);
  ~RecordLog();
  RecordLog(const RecordLog&) = delete;
  RecordLog& operator=(const RecordLog&) = delete;

  void append(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  off_t size_ = 0;  // bytes of whole records
};

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
  // After on_end: the test split's figures join summary.json as test_loss, test_accuracy,
  // test_samples, test_items and test_time_s (the eval_ keys' test_ twins).
  void add_test(const core::EvalRecord& record);

  static nlohmann::json to_json(const core::StepRecord& record, bool items_are_tokens);
  static nlohmann::json to_json(const core::EvalRecord& record);

 private:
  void write_line(const nlohmann::json& line);

  std::string output_dir_;
  bool items_are_tokens_;
  RecordLog metrics_;
  core::RunInfo info_{core::BatchGeometry::from_accumulation(1, 1)};
  int64_t last_micro_batch_ = 0, last_accumulation_ = 0;  // of the last step written
  // What this process trained (a resumed run's summary counts the checkpoint's samples too):
  // the throughput in summary.json is over these.
  int64_t trained_samples_ = 0, trained_items_ = 0;
  nlohmann::json summary_;  // summary.json as on_end wrote it
};

}  // namespace gradaccum::io
