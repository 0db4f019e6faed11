#include "gradaccum/cli/verify_command.h"

#include <cmath>
#include <filesystem>
#include <sstream>

#include "gradaccum/base/check.h"
#include "gradaccum/base/files.h"
#include "gradaccum/cli/plot_command.h"
#include "gradaccum/core/batch_geometry.h"
#include "gradaccum/core/trainer.h"
#include "gradaccum/io/config.h"
#include "gradaccum/io/workload.h"
#include "gradaccum/report/run_files.h"
#include "gradaccum/run/process_setup.h"

namespace gradaccum::cli {

namespace {

struct Split {
  int64_t micro_batch = 0, steps = 0;
  int64_t global_batch = 0;  // b × N, checked by core::BatchGeometry
  std::string text;
};

std::vector<Split> parse_splits(const std::string& text) {
  std::vector<Split> splits;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    Split s;
    s.text = item;
    char x = 0;
    std::istringstream parse(item);
    GA_CHECK((parse >> s.micro_batch >> x >> s.steps) && x == 'x' && parse.peek() == EOF && s.micro_batch >= 1 &&
                 s.steps >= 1,
             "--splits: '{}' is not BxN with B, N >= 1 (e.g. 16x4)", item);
    try {
      s.global_batch = core::BatchGeometry::from_accumulation(s.micro_batch, s.steps).global_batch();
    } catch (const Error& e) {
      throw Error(fmt::format("--splits: '{}': {}", item, e.what()));
    }
    splits.push_back(s);
  }
  GA_CHECK(splits.size() >= 2, "--splits: give at least two splits, got '{}'", text);
  for (const auto& s : splits) {
    GA_CHECK(s.global_batch == splits[0].global_batch,
             "--splits: {} is a global batch of {}, {} one of {}: compare splits of the same batch", s.text,
             s.global_batch, splits[0].text, splits[0].global_batch);
  }
  return splits;
}

class Trajectory final : public core::TrainingObserver {
 public:
  void on_step(const core::StepRecord& r) override {
    loss.push_back(r.loss);
    grad_norm.push_back(r.grad_norm);
  }
  std::vector<double> loss, grad_norm;
};

double max_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-300));
  }
  return worst;
}

// The weights training changes: frozen ones (a LoRA base) would only dilute the comparison.
torch::Tensor flat_weights(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (auto& p : m.parameters()) {
    if (p.requires_grad()) parts.push_back(p.detach().reshape(-1).to(torch::kDouble));
  }
  return torch::cat(parts);
}

}  // namespace

int run_verify(const VerifyArgs& args) {
  GA_CHECK(args.steps >= 1, "--steps must be >= 1, got {}", args.steps);
  GA_CHECK(!args.plots || !args.output_dir.empty(), "--plots needs --output-dir (where the figures go)");
  const auto splits = parse_splits(args.splits);
  if (!args.output_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(args.output_dir, error);
    GA_CHECK(std::filesystem::is_directory(args.output_dir), "--output-dir: cannot create {}", args.output_dir);
  }
  auto overrides = args.overrides;
  // Verification runs in float64, where exact accumulation agrees to ~1e-16.
  for (const char* o : {"dtype=float64", "data.eval_limit=-1", "global_batch_size=0"}) overrides.emplace_back(o);
  overrides.push_back(fmt::format("max_steps={}", args.steps));
  const auto config = io::load_config(args.config_path, overrides);
  const run::ProcessSetup process({.threads = config.threads});

  fmt::print("verify: {} steps in float64, global batch {}, tolerance {:.0e}\n", args.steps, splits[0].global_batch,
             args.tolerance);
  fmt::print("{:>10}  {:>14}  {:>14}  {:>14}\n", "split", "max rel loss", "max rel |g|", "rel weights");
  Trajectory reference;
  torch::Tensor reference_weights;
  bool ok = true;
  report::VerifyRun record;
  record.steps = args.steps;
  record.global_batch = splits[0].global_batch;
  record.tolerance = args.tolerance;
  for (size_t k = 0; k < splits.size(); ++k) {
    auto options = config.trainer;
    options.per_device_train_batch_size = splits[k].micro_batch;
    options.gradient_accumulation_steps = splits[k].steps;
    torch::manual_seed(options.seed);                                // the same initial weights for every split
    auto workload = io::make_workload(config, /*with_eval=*/false);  // any data.type and model.type
    auto& model = *workload.model.task;
    Trajectory trajectory;
    core::Trainer(options, model, *workload.train, nullptr, trajectory).run();
    auto weights = flat_weights(model.module());
    record.splits.push_back({splits[k].text, trajectory.loss, trajectory.grad_norm, 0.0, 0.0, 0.0});
    if (k == 0) {
      reference = trajectory;
      reference_weights = weights;
      fmt::print("{:>10}  {:>14}  {:>14}  {:>14}\n", splits[k].text, "(reference)", "", "");
      continue;
    }
    const double dl = max_relative(trajectory.loss, reference.loss);
    const double dg = max_relative(trajectory.grad_norm, reference.grad_norm);
    const double dw = ((weights - reference_weights).abs().max() / reference_weights.abs().max()).item<double>();
    const bool pass = dl <= args.tolerance && dg <= args.tolerance && dw <= args.tolerance;
    ok = ok && pass;
    record.splits.back().max_relative_loss = dl;
    record.splits.back().max_relative_grad_norm = dg;
    record.splits.back().relative_weights = dw;
    fmt::print("{:>10}  {:>14.3e}  {:>14.3e}  {:>14.3e}  {}\n", splits[k].text, dl, dg, dw, pass ? "ok" : "DIFFERS");
  }
  fmt::print("{}\n", ok ? "exact: every split follows the full-batch trajectory"
                        : "NOT exact: some split departs from the reference beyond the tolerance");
  if (!args.output_dir.empty()) {
    record.exact = ok;
    const auto path = (std::filesystem::path(args.output_dir) / "verify.json").string();
    base::write_file_atomically(path, report::to_json_text(record));
    fmt::print("trajectories: {}\n", path);
    if (args.plots) write_plots_and_report(args.output_dir);
  }
  return ok ? 0 : 1;
}

}  // namespace gradaccum::cli
