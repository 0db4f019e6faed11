// core/loss_scaling.h on its own: the multiplier each micro-step's loss sum gets under fp16
// (scale / items, items a power of two near a micro-batch's item count), its change with the
// micro-batch, nothing at all without fp16, and the checkpoint's scale saved and refused.
#include "gradaccum/core/loss_scaling.h"

#include <gtest/gtest.h>

#include "gradaccum/base/check.h"

namespace loss_scaling_test {

using namespace gradaccum::core;
namespace optim = gradaccum::optim;

// Samples of 41 tokens: 40 items each (a causal LM's targets).
class FortyOneTokens final : public Dataset {
 public:
  int64_t size() const override { return 8; }
  Batch get(const torch::Tensor&, torch::ScalarType) const override { return {}; }
  torch::Tensor sample_lengths() const override { return torch::full({8}, 41, torch::kLong); }
};

double multiplier(LossScaling& scaling) {
  WindowPlan plan{8, BatchGeometry::from_accumulation(2, 4, 1), LastWindow::partial, 7, SampleOrder::random};
  const auto window = plan.window(plan.permutation(0), 0, 0);
  WindowState w(window, 0, 0);
  scaling.begin_window(w);
  return w.loss_multiplier;
}

TEST(LossScaling, MultipliesByTheScaleOverAPowerOfTwoNearTheItems) {
  FortyOneTokens data;
  optim::LossScalerOptions options;
  options.init_scale = 1024.0;
  LossScaling scaling(MixedPrecision::fp16, options, data, 3);  // 3 × 40 = 120 items: 64
  ASSERT_NE(scaling.scaler(), nullptr);
  EXPECT_EQ(multiplier(scaling), 1024.0 / 64.0);
  scaling.set_micro_batch(1);  // 40 items: 32
  EXPECT_EQ(multiplier(scaling), 1024.0 / 32.0);
}

TEST(LossScaling, DoesNothingWithoutFp16) {
  FortyOneTokens data;
  for (const auto precision : {MixedPrecision::none, MixedPrecision::bf16}) {
    LossScaling scaling(precision, {}, data, 3);
    EXPECT_EQ(scaling.scaler(), nullptr);
    EXPECT_EQ(multiplier(scaling), 1.0);
    TrainingState state;
    scaling.save(state);
    EXPECT_FALSE(state.loss_scaler.has_value());
  }
}

TEST(LossScaling, SavesAndRestoresTheScale) {
  FortyOneTokens data;
  LossScaling scaling(MixedPrecision::fp16, {}, data, 2);
  TrainingState state;
  state.loss_scaler = optim::LossScalerState{256.0, 7};
  scaling.restore(state);
  TrainingState saved;
  scaling.save(saved);
  ASSERT_TRUE(saved.loss_scaler.has_value());
  EXPECT_EQ(saved.loss_scaler->scale, 256.0);
  EXPECT_EQ(saved.loss_scaler->growth_tracker, 7);
  EXPECT_EQ(multiplier(scaling), 256.0 / 64.0);  // 2 × 40 = 80 items: 64
}

// The partial gradients of a window saved inside carry the saved run's scale (or none).
TEST(LossScaling, RefusesAWindowSavedInsideUnderAnotherPrecision) {
  FortyOneTokens data;
  TrainingState inside;
  inside.position.micro_step = 2;
  LossScaling fp16(MixedPrecision::fp16, {}, data, 2);
  try {
    fp16.restore(inside);
    FAIL() << "an fp16 run continued a window saved without fp16";
  } catch (const gradaccum::Error& e) {
    EXPECT_STREQ(e.what(),
                 "checkpoint: it was saved inside a window without fp16; resume it with the same mixed_precision");
  }
  LossScaling none(MixedPrecision::none, {}, data, 2);
  inside.loss_scaler = optim::LossScalerState{};
  EXPECT_THROW(none.restore(inside), gradaccum::Error);
  inside.position.micro_step = 0;  // between windows: the new run's scaler starts afresh
  EXPECT_NO_THROW(none.restore(inside));
}

}  // namespace loss_scaling_test
