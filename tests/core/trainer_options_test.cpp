// core/trainer_options.h: validate() holds every rule that ties the trainer's options together,
// once, for the library and the configuration alike; its messages name the options the way the
// caller names them (the library's field names, or the configuration's keys).
#include "gradaccum/core/trainer_options.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace trainer_options_test {

using namespace gradaccum::core;
using gradaccum::testing::error_of;

std::string refusal(const TrainerOptions& o, int64_t world = 1, const OptionNames& names = {}) {
  return error_of([&] { validate(o, world, names); });
}

TEST(TrainerOptionsValidate, TheDefaultsHold) {
  EXPECT_EQ(refusal(TrainerOptions{}), "");
  EXPECT_EQ(refusal(TrainerOptions{}, 3), "");
}

TEST(TrainerOptionsValidate, EveryRuleNamesItsOptions) {
  TrainerOptions fp64_bf16;
  fp64_bf16.dtype = torch::kDouble;
  fp64_bf16.mixed_precision = MixedPrecision::bf16;
  EXPECT_EQ(refusal(fp64_bf16), "option 'mixed_precision': bf16 keeps parameters in float32 and needs dtype: float32");

  TrainerOptions tokens;
  tokens.window_tokens = 100;
  auto with = [&](auto change) {
    auto o = tokens;
    change(o);
    return refusal(o);
  };
  EXPECT_EQ(refusal(tokens), "");
  EXPECT_EQ(with([](TrainerOptions& o) { o.global_batch_size = 64; }),
            "option 'window_tokens': cannot be combined with global_batch_size (the windows are measured in tokens)");
  EXPECT_EQ(with([](TrainerOptions& o) { o.deterministic_accumulation = true; }),
            "option 'window_tokens': cannot be combined with deterministic_accumulation (its tree needs the same "
            "number of micro-batches in every window)");
  EXPECT_EQ(with([](TrainerOptions& o) { o.last_window = LastWindow::carry; }),
            "option 'window_tokens': cannot be combined with last_window: carry");
  EXPECT_EQ(with([](TrainerOptions& o) { o.loss_normalization = LossNormalization::micro_batch; }),
            "option 'window_tokens': needs loss_normalization window or sum, not micro_batch (N varies per window)");

  TrainerOptions tree;
  tree.deterministic_accumulation = true;
  EXPECT_EQ(refusal(tree, 4), "");
  EXPECT_EQ(refusal(tree, 3), "option 'deterministic_accumulation': the world size must be a power of two, not 3");
  tree.max_tokens_per_micro_batch = 512;
  EXPECT_EQ(refusal(tree),
            "option 'max_tokens_per_micro_batch': cannot be combined with deterministic_accumulation (the number of "
            "micro-batches per rank would depend on the world size)");
  tree.max_tokens_per_micro_batch = 0;
  tree.loss_normalization = LossNormalization::micro_batch;
  EXPECT_EQ(refusal(tree),
            "option 'deterministic_accumulation': needs loss_normalization window or sum, not micro_batch");

  TrainerOptions no_epochs;
  no_epochs.num_train_epochs = 0;
  EXPECT_EQ(refusal(no_epochs), "num_train_epochs must be >= 1, got 0");
  no_epochs.max_steps = 5;
  EXPECT_EQ(refusal(no_epochs), "");
}

TEST(TrainerOptionsValidate, TheCallerNamesTheOptions) {
  TrainerOptions o;
  o.window_tokens = 100;
  o.global_batch_size = 64;
  const OptionNames config({{"global_batch_size", "data.global_batch"}}, "key");
  EXPECT_EQ(refusal(o, 1, config),
            "key 'window_tokens': cannot be combined with data.global_batch (the windows are measured in tokens)");
  EXPECT_EQ(config.subject("seed"), "key 'seed'");
  EXPECT_EQ(OptionNames().subject("seed"), "option 'seed'");
}

}  // namespace trainer_options_test
