// Seed 000: accumulated gradients equal the full-batch gradient for the
// 16→32→GELU→1 MLP under every split, and not for its BatchNorm variant.
// Golden values: tests/fixtures/gen_seed000_golden.py (PyTorch, float64).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dtype_cases.h"
#include "gradaccum/core/batch_dependence.h"
#include "gradaccum/models/networks.h"
#include "gradaccum/models/tasks.h"
#include "test_support.h"

namespace seed000_test {

using gradaccum::core::LossNormalization;
using gradaccum::models::Regressor;
using gradaccum::testing::accumulate_window;
using gradaccum::testing::flat_grads;
using gradaccum::testing::max_relative_difference;

const nlohmann::json& golden() {
  static const nlohmann::json j =
      nlohmann::json::parse(gradaccum::testing::read_text(std::string(GRADACCUM_TEST_DATA) + "/seed000_golden.json"));
  return j;
}

torch::Tensor from_json(const nlohmann::json& values, std::vector<int64_t> shape) {
  return torch::tensor(values.get<std::vector<double>>(), torch::kDouble).reshape(shape);
}

// The seed's network with PyTorch's initial weights, in `dtype`.
Regressor make_model(const std::string& variant, torch::ScalarType dtype) {
  Regressor model = variant == "batchnorm" ? Regressor(gradaccum::models::seed000_sequential_mlp(true))
                                           : Regressor(gradaccum::models::seed000_mlp());
  model.module().to(dtype);  // first: copying into float32 would round the golden weights
  torch::NoGradGuard no_grad;
  for (auto& item : model.module().named_parameters()) {
    auto values = from_json(golden()[variant]["params"][item.key()], item.value().sizes().vec());
    item.value().copy_(values);
  }
  return model;
}

torch::Tensor golden_grads(const std::string& variant, const std::string& key = "grads") {
  std::vector<torch::Tensor> parts;
  // In the order of named_parameters(), which PyTorch and libtorch share.
  auto model = make_model(variant, torch::kDouble);
  for (const auto& item : model.module().named_parameters()) {
    parts.push_back(from_json(golden()[variant][key][item.key()], {-1}));
  }
  return torch::cat(parts);
}

struct Split {
  std::string name;
  std::vector<int64_t> sizes;
  int64_t accumulation_steps;
};

const std::vector<Split> kSplits = {
    {"8x1", {8}, 1},         {"4x2", {4, 4}, 2}, {"2x4", {2, 2, 2, 2}, 4}, {"1x8", {1, 1, 1, 1, 1, 1, 1, 1}, 8},
    {"3+3+2", {3, 3, 2}, 3},
};

void expect_all_splits_match_full_batch(torch::ScalarType dtype, double tolerance) {
  const auto x = from_json(golden()["x"], {8, 16}).to(dtype);
  const auto y = from_json(golden()["y"], {8, 1}).to(dtype);
  const auto expected = golden_grads("gelu");
  const double expected_loss = golden()["gelu"]["loss"].get<double>();
  for (const auto& split : kSplits) {
    auto model = make_model("gelu", dtype);
    const double loss =
        accumulate_window(model, x, y, split.sizes, LossNormalization::window, split.accumulation_steps);
    EXPECT_LE(max_relative_difference(flat_grads(model.module()), expected), tolerance) << split.name;
    EXPECT_NEAR(loss, expected_loss, tolerance * expected_loss) << split.name;
  }
}

class Seed000MlpDtypes : public ::testing::TestWithParam<gradaccum::testing::DtypeCase> {};

TEST_P(Seed000MlpDtypes, EverySplitEqualsFullBatch) {
  expect_all_splits_match_full_batch(GetParam().dtype, GetParam().tolerance);
}

INSTANTIATE_TEST_SUITE_P(, Seed000MlpDtypes, gradaccum::testing::dtype_cases(1e-10, 1e-5),
                         gradaccum::testing::dtype_case_name);

TEST(Seed000Mlp, NaiveMicroBatchMeanDiffersOnUnevenSplit) {
  const auto x = from_json(golden()["x"], {8, 16});
  const auto y = from_json(golden()["y"], {8, 1});
  const auto expected = golden_grads("gelu");
  // Even splits: mean / N is exact (every micro-batch holds the same count).
  auto even = make_model("gelu", torch::kDouble);
  accumulate_window(even, x, y, {2, 2, 2, 2}, LossNormalization::micro_batch, 4);
  EXPECT_LE(max_relative_difference(flat_grads(even.module()), expected), 1e-10);
  // Uneven 3+3+2: the last micro-batch's samples weigh 1/(3*2) instead of 1/8.
  auto uneven = make_model("gelu", torch::kDouble);
  accumulate_window(uneven, x, y, {3, 3, 2}, LossNormalization::micro_batch, 3);
  EXPECT_GT(max_relative_difference(flat_grads(uneven.module()), expected), 1e-3);
}

TEST(Seed000BatchNorm, AccumulationDiffersFromFullBatchAndWarns) {
  const auto x = from_json(golden()["x"], {8, 16});
  const auto y = from_json(golden()["y"], {8, 1});
  auto full = make_model("batchnorm", torch::kDouble);
  accumulate_window(full, x, y, {8}, LossNormalization::window, 1);
  EXPECT_LE(max_relative_difference(flat_grads(full.module()), golden_grads("batchnorm")), 1e-10);

  auto accumulated = make_model("batchnorm", torch::kDouble);
  accumulate_window(accumulated, x, y, {2, 2, 2, 2}, LossNormalization::window, 4);
  const auto grads = flat_grads(accumulated.module());
  // Matches PyTorch's own 4 × 2 accumulation, and both differ from the full batch.
  EXPECT_LE(max_relative_difference(grads, golden_grads("batchnorm", "grads_accumulated_4x2")), 1e-10);
  EXPECT_GT(max_relative_difference(grads, golden_grads("batchnorm")), 1e-2);

  const auto layers = gradaccum::core::batch_dependent_layers(accumulated.module());
  ASSERT_EQ(layers.size(), 1u);
  EXPECT_EQ(layers[0], "model.1");
  const auto warning = gradaccum::core::batch_dependence_warning(accumulated.module(), 4, 1);
  EXPECT_NE(warning.find("BatchNorm"), std::string::npos);
  EXPECT_NE(warning.find("model.1"), std::string::npos);
  EXPECT_NE(warning.find("model.norm=group"), std::string::npos);
  // No warning when the batch is not split, nor for the GELU model, nor in eval mode.
  EXPECT_EQ(gradaccum::core::batch_dependence_warning(accumulated.module(), 1, 1), "");
  auto gelu = make_model("gelu", torch::kDouble);
  EXPECT_EQ(gradaccum::core::batch_dependence_warning(gelu.module(), 4, 1), "");
  accumulated.module().eval();
  EXPECT_EQ(gradaccum::core::batch_dependence_warning(accumulated.module(), 4, 1), "");
}

}  // namespace seed000_test
