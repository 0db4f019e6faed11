// What a run directory holds, read back for figures and the report: the per-step records of
// metrics.jsonl (training steps and evaluations), grad_flow.jsonl, summary.json, config.yaml, and
// verify.json for a directory written by `gradaccum verify --output-dir`.
// Reading needs nothing but the files: a run in progress, a preempted run (no summary.json) and
// a run without gradient flow all read; what is absent stays empty.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace gradaccum::report {

// One optimizer step of metrics.jsonl. NaN where a record lacks a field (a skipped fp16 step has
// a loss, but older records have no micro-step counts).
struct StepPoint {
  int64_t step = 0;
  double loss = 0.0, lr = 0.0, grad_norm = 0.0, grad_norm_clipped = 0.0;
  double items = 0.0;        // the window's normalizer: tokens or samples, summed over ranks
  double items_per_s = 0.0;  // tokens/s or samples/s
  double loss_scale = 0.0;   // fp16 runs; 0 otherwise
  bool skipped = false;
  std::vector<double> micro_step_items;  // each micro-step's items, summed over ranks
  std::vector<double> rank_items;        // each rank's items (data parallel)
  std::string loss_normalization;
};

struct EvalPoint {
  int64_t step = 0;
  double loss = 0.0;
};

// One logged step of grad_flow.jsonl: per parameter tensor, in the model's order.
struct GradFlowPoint {
  int64_t step = 0;
  std::vector<std::string> names;
  std::vector<double> mean_abs, max_abs, zero_fraction;
};

// One split of a `gradaccum verify` run.
struct VerifySplit {
  std::string split;  // "BxN"
  std::vector<double> loss, grad_norm;
  double max_relative_loss = 0.0, max_relative_grad_norm = 0.0, relative_weights = 0.0;
};

struct VerifyRun {
  int64_t steps = 0, global_batch = 0;
  double tolerance = 0.0;
  bool exact = false;
  std::vector<VerifySplit> splits;  // the first is the reference
};

struct RunFiles {
  std::string directory;
  bool items_are_tokens = false;  // metrics.jsonl carries tokens_per_s
  std::vector<StepPoint> steps;
  std::vector<EvalPoint> evals;
  std::vector<GradFlowPoint> grad_flow;
  nlohmann::json summary;   // summary.json, or null
  std::string config_yaml;  // config.yaml, or empty
  std::optional<VerifyRun> verify;
};

// Reads `directory`. Throws gradaccum::Error (one line) when it is not a directory, when it has
// neither metrics.jsonl nor verify.json, or when a file is not what gradaccum writes (naming the
// file and line).
RunFiles read_run_files(const std::string& directory);

// verify.json's text for `run` (what `gradaccum verify --output-dir` writes).
std::string to_json_text(const VerifyRun& run);

}  // namespace gradaccum::report
