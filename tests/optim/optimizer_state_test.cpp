// Optimizer state under parameter names (optim/optimizer_state.h), through the safetensors bytes
// a checkpoint holds: bit-identical round trips for AdamW (plain and amsgrad) and SGD with
// momentum, the keys, and one-line errors for state that does not fit.
#include "gradaccum/optim/optimizer_state.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "gradaccum/base/check.h"
#include "gradaccum/formats/safetensors.h"
#include "gradaccum/optim/optimizer_factory.h"

namespace optimizer_state_test {

using gradaccum::optim::load_optimizer_state;
using gradaccum::optim::optimizer_state;

const std::vector<std::string> kNames = {"encoder.weight", "encoder.bias", "head.weight"};

// The parameters under kNames.
gradaccum::optim::NamedParameters named(const std::vector<torch::Tensor>& params) {
  gradaccum::optim::NamedParameters out;
  for (size_t i = 0; i < params.size(); ++i) out.emplace_back(kNames[i], params[i]);
  return out;
}

std::vector<torch::Tensor> make_params(uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({4, 3}).requires_grad_(), torch::randn({4}).requires_grad_(),
          torch::randn({2, 4}).requires_grad_()};
}

// Three steps on fixed pseudo-random gradients.
void take_steps(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params, int steps,
                uint64_t seed) {
  torch::manual_seed(seed);
  for (int s = 0; s < steps; ++s) {
    for (const auto& p : params) p.mutable_grad() = torch::randn_like(p);
    optimizer.step();
  }
}

std::unique_ptr<torch::optim::Optimizer> make(const std::string& kind, const std::vector<torch::Tensor>& params) {
  if (kind == "adamw-amsgrad") {
    return std::make_unique<torch::optim::AdamW>(params,
                                                 torch::optim::AdamWOptions(1e-2).weight_decay(0.1).amsgrad(true));
  }
  gradaccum::optim::OptimizerSpec spec;
  spec.type = gradaccum::optim::optimizer_type_names().parse(kind, "optim");
  spec.learning_rate = 1e-2;
  spec.weight_decay = 0.1;
  spec.momentum = 0.9;
  return gradaccum::optim::make_optimizer(spec, params);
}

class OptimizerStateRoundTrip : public ::testing::TestWithParam<std::string> {};

// Saved after 3 steps, loaded into a fresh optimizer over copies of the parameters: every state
// tensor is bit-identical, and 2 more steps on both give bit-identical parameters.
TEST_P(OptimizerStateRoundTrip, SafetensorsBytesRestoreTheStateBitForBit) {
  auto params = make_params(1);
  auto optimizer = make(GetParam(), params);
  take_steps(*optimizer, params, 3, 2);
  const auto bytes = gradaccum::formats::serialize_safetensors(optimizer_state(*optimizer, named(params)));

  std::vector<torch::Tensor> copies;
  for (const auto& p : params) copies.push_back(p.detach().clone().requires_grad_());
  auto restored = make(GetParam(), copies);
  load_optimizer_state(*restored, named(copies), gradaccum::formats::parse_safetensors(bytes, "memory"), "memory");

  const auto before = optimizer_state(*optimizer, named(params));
  const auto after = optimizer_state(*restored, named(copies));
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(before[i].first, after[i].first);
    EXPECT_TRUE(torch::equal(before[i].second, after[i].second)) << before[i].first;
  }
  take_steps(*optimizer, params, 2, 5);
  take_steps(*restored, copies, 2, 5);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], copies[i])) << kNames[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OptimizerStateRoundTrip, ::testing::Values("adamw", "adamw-amsgrad", "sgd"),
                         [](const auto& info) {
                           auto name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(OptimizerState, KeysAreParameterNamesAndFields) {
  auto params = make_params(1);
  auto adamw = make("adamw", params);
  take_steps(*adamw, params, 3, 2);
  std::set<std::string> keys;
  for (const auto& [key, tensor] : optimizer_state(*adamw, named(params))) keys.insert(key);
  const std::set<std::string> expected = {"encoder.weight.step", "encoder.weight.exp_avg", "encoder.weight.exp_avg_sq",
                                          "encoder.bias.step",   "encoder.bias.exp_avg",   "encoder.bias.exp_avg_sq",
                                          "head.weight.step",    "head.weight.exp_avg",    "head.weight.exp_avg_sq"};
  EXPECT_EQ(keys, expected);
  for (const auto& [key, tensor] : optimizer_state(*adamw, named(params))) {
    if (key.ends_with(".step")) EXPECT_EQ(tensor.item<int64_t>(), 3) << key;
  }
  auto sgd = make("sgd", params);
  EXPECT_TRUE(optimizer_state(*sgd, named(params)).empty());  // never stepped: no state
}

std::string load_error(const gradaccum::optim::NamedStateTensors& state) {
  auto params = make_params(1);
  auto adamw = make("adamw", params);
  try {
    load_optimizer_state(*adamw, named(params), state, "ckpt/optimizer.safetensors");
  } catch (const gradaccum::Error& e) {
    return e.what();
  }
  return "";
}

TEST(OptimizerState, StateThatDoesNotFitIsAOneLineErrorNamingIt) {
  EXPECT_EQ(load_error({{"decoder.weight.exp_avg", torch::zeros({4, 3})}}),
            "ckpt/optimizer.safetensors: optimizer state decoder.weight.exp_avg belongs to no "
            "parameter of this model");
  EXPECT_EQ(load_error({{"encoder.weight.exp_avg", torch::zeros({3, 4})}}),
            "ckpt/optimizer.safetensors: optimizer state encoder.weight.exp_avg has shape 3x4, its "
            "parameter 4x3");
  EXPECT_EQ(load_error({{"encoder.weight.momentum_buffer", torch::zeros({4, 3})}}),
            "ckpt/optimizer.safetensors: optimizer state encoder.weight.momentum_buffer is not a "
            "field of this optimizer's state");
  EXPECT_EQ(load_error({{"encoder.weight.exp_avg", torch::zeros({4, 3})}}),
            "ckpt/optimizer.safetensors: the AdamW state of encoder.weight lacks step, exp_avg or "
            "exp_avg_sq");
  EXPECT_EQ(load_error({{"encoder.bias.step", torch::zeros({}, torch::kDouble)}}),
            "ckpt/optimizer.safetensors: optimizer state encoder.bias.step is not an int64 scalar "
            "of an AdamW state");
}

}  // namespace optimizer_state_test
