// Gradient flow (core/grad_flow.h): the per-parameter statistics the Trainer reports are those
// of the full batch's gradient whatever the decomposition, and the program writes them to
// grad_flow.jsonl.
#include "gradaccum/core/grad_flow.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "gradaccum/core/trainer.h"
#include "gradaccum/models/networks.h"
#include "gradaccum/models/tasks.h"
#include "test_support.h"

namespace grad_flow_test {

using namespace gradaccum;

struct Collect final : core::TrainingObserver {
  void on_grad_flow(const core::GradFlowRecord& r) override { records.push_back(r); }
  std::vector<core::GradFlowRecord> records;
};

// Seed 000's MLP on 8 fixed samples in float32, trained b × n for 3 steps with gradient flow at
// every step.
std::vector<core::GradFlowRecord> train(int64_t b, int64_t n, const torch::Tensor& x, const torch::Tensor& y) {
  gradaccum::testing::TensorDataset data(x, y);
  torch::manual_seed(1);
  models::Regressor model(models::seed000_mlp());
  core::TrainerOptions o;
  o.per_device_train_batch_size = b;
  o.gradient_accumulation_steps = n;
  o.max_steps = 3;
  o.optimizer.learning_rate = 1e-2;
  o.max_grad_norm = 0.05;  // clipped: the records must hold the gradient before clipping
  o.sample_order = core::SampleOrder::sequential;
  o.grad_flow_steps = 1;
  Collect collect;
  core::Trainer trainer(o, model, data, nullptr, collect);
  trainer.run();
  return collect.records;
}

TEST(GradFlow, PerParameterStatisticsAreTheFullBatchGradientsForEveryDecomposition) {
  torch::manual_seed(0);
  const auto x = torch::randn({8, 16});
  const auto y = torch::randn({8, 1});

  // The full batch's gradient at the initial weights, computed directly.
  torch::manual_seed(1);
  models::Regressor reference(models::seed000_mlp());
  core::Batch batch;
  batch.input = x;
  batch.target = y;
  batch.samples = 8;
  const auto l = reference.loss(batch);
  (l.sum / l.count).backward();
  std::vector<std::string> names;
  std::vector<double> mean_abs, max_abs, zeros;
  for (const auto& item : reference.module().named_parameters()) {
    names.push_back(item.key());
    const auto g = item.value().grad().abs().to(torch::kDouble);
    mean_abs.push_back(g.mean().item<double>());
    max_abs.push_back(g.max().item<double>());
    zeros.push_back((g == 0).to(torch::kDouble).mean().item<double>());
  }
  ASSERT_EQ(names.size(), 4u);

  std::vector<std::vector<core::GradFlowRecord>> runs;
  for (auto [b, n] : std::vector<std::pair<int64_t, int64_t>>{{8, 1}, {4, 2}, {1, 8}}) {
    SCOPED_TRACE(std::to_string(b) + "x" + std::to_string(n));
    runs.push_back(train(b, n, x, y));
    const auto& records = runs.back();
    ASSERT_EQ(records.size(), 3u);
    for (size_t s = 0; s < records.size(); ++s) EXPECT_EQ(records[s].step, static_cast<int64_t>(s) + 1);
    const auto& first = records[0];
    EXPECT_EQ(first.names, names);
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_LE(gradaccum::testing::relative_difference(first.mean_abs[i], mean_abs[i]), 1e-6) << names[i];
      EXPECT_LE(gradaccum::testing::relative_difference(first.max_abs[i], max_abs[i]), 1e-6) << names[i];
      EXPECT_EQ(first.zero_fraction[i], zeros[i]) << names[i];
    }
  }
  // The later steps agree across decompositions too (the same trajectory).
  for (size_t k = 1; k < runs.size(); ++k) {
    for (size_t s = 1; s < 3; ++s) {
      for (size_t i = 0; i < names.size(); ++i) {
        EXPECT_LE(gradaccum::testing::relative_difference(runs[k][s].mean_abs[i], runs[0][s].mean_abs[i]), 1e-5)
            << names[i] << " step " << s + 1 << " decomposition " << k;
      }
    }
  }
}

// The statistics themselves: exact on small known gradients, float32-accurate on a large one,
// one row per parameter whatever its dtype, and 0, 0, 1 for a parameter without a gradient.
TEST(GradFlow, StatisticsOfKnownGradientsInEveryDtype) {
  auto known = torch::zeros({4}, torch::kDouble).requires_grad_();
  known.mutable_grad() = torch::tensor({0.0, -3.0, 1.0, 0.0}, torch::kDouble);
  auto half = torch::zeros({2, 2}, torch::kBFloat16).requires_grad_();
  half.mutable_grad() = torch::tensor({{0.5, 0.0}, {-2.0, 0.0}}).to(torch::kBFloat16);
  auto none = torch::zeros({3}).requires_grad_();
  torch::manual_seed(3);
  auto large = torch::zeros({1 << 20}).requires_grad_();
  large.mutable_grad() = torch::randn({1 << 20});
  large.mutable_grad().narrow(0, 0, 1000).zero_();

  const auto s = core::grad_flow_statistics({known, half, none, large});
  ASSERT_EQ(s.sizes(), (std::vector<int64_t>{4, 3}));
  ASSERT_EQ(s.scalar_type(), torch::kDouble);
  const auto r = core::grad_flow_record(7, {"known", "half", "none", "large"}, s);
  EXPECT_EQ(r.mean_abs[0], 1.0);
  EXPECT_EQ(r.max_abs[0], 3.0);
  EXPECT_EQ(r.zero_fraction[0], 0.5);
  EXPECT_EQ(r.mean_abs[1], 0.625);
  EXPECT_EQ(r.max_abs[1], 2.0);
  EXPECT_EQ(r.zero_fraction[1], 0.5);
  EXPECT_EQ(r.mean_abs[2], 0.0);
  EXPECT_EQ(r.max_abs[2], 0.0);
  EXPECT_EQ(r.zero_fraction[2], 1.0);
  const auto g = large.grad().to(torch::kDouble).abs();
  EXPECT_LE(gradaccum::testing::relative_difference(r.mean_abs[3], g.mean().item<double>()), 1e-7);
  EXPECT_EQ(r.max_abs[3], g.max().item<double>());
  EXPECT_EQ(r.zero_fraction[3], 1000.0 / (1 << 20));
}

// The program writes grad_flow.jsonl at every grad_flow_steps-th step (default logging_steps),
// one entry per parameter tensor in registration order; 0 turns it off.
TEST(GradFlow, ProgramWritesGradFlowJsonl) {
  const auto dir = gradaccum::testing::make_temp_dir("grad-flow");
  const std::string run =
      "train --set model.type=mlp --set model.hidden=[16] --set data.train_limit=128 "
      "--set data.eval_limit=0 --set max_steps=6 --set threads=2 --set logging_steps=2 "
      "--set output_dir=";
  const auto r = gradaccum::testing::run_cli(run + dir + "/a");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = gradaccum::testing::read_jsonl(dir + "/a/grad_flow.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  std::vector<std::string> names;
  for (const auto& p : lines[0]["parameters"]) names.push_back(p["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"fc0.weight", "fc0.bias", "norm0.weight", "norm0.bias", "head.weight",
                                             "head.bias"}));
  for (size_t k = 0; k < lines.size(); ++k) {
    EXPECT_EQ(lines[k]["step"], 2 * static_cast<int64_t>(k + 1));
    for (const auto& p : lines[k]["parameters"]) {
      EXPECT_GT(p["mean_abs"].get<double>(), 0.0) << p;
      EXPECT_GE(p["max_abs"].get<double>(), p["mean_abs"].get<double>()) << p;
      EXPECT_GE(p["zero_fraction"].get<double>(), 0.0) << p;
      EXPECT_LT(p["zero_fraction"].get<double>(), 1.0) << p;
    }
  }
  const auto off = gradaccum::testing::run_cli(run + dir + "/b --set grad_flow_steps=0");
  ASSERT_EQ(off.exit_code, 0) << off.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/b/grad_flow.jsonl"));
  std::filesystem::remove_all(dir);
}

}  // namespace grad_flow_test
