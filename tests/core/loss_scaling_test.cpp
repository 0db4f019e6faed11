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
    EXPECT_TRUE(state.pieces.empty());
  }
}

TEST(LossScaling, SavesAndRestoresTheScale) {
  FortyOneTokens data;
  LossScaling scaling(MixedPrecision::fp16, {}, data, 2);
  TrainingState state;
  state.piece(LossScaling::kPiece).set_real("scale", 256.0);
  state.piece(LossScaling::kPiece).set_integer("growth_tracker", 7);
  scaling.restore(state);
  EXPECT_EQ(scaling.scaler()->state().scale, 256.0);
  EXPECT_EQ(scaling.scaler()->state().growth_tracker, 7);
  EXPECT_EQ(multiplier(scaling), 256.0 / 64.0);  // 2 × 40 = 80 items: 64
  // Its save gives the same fields back, and another scaling restored from them the same scale.
  TrainingState saved;
  scaling.save(saved);
  const auto piece = saved.saved_piece(LossScaling::kPiece);
  EXPECT_EQ(piece.scalars.size(), 2u);
  EXPECT_EQ(piece.real("scale"), 256.0);
  EXPECT_EQ(piece.integer("growth_tracker"), 7);
  LossScaling again(MixedPrecision::fp16, {}, data, 2);
  again.restore(saved);
  EXPECT_EQ(again.scaler()->state().scale, 256.0);
  EXPECT_EQ(again.scaler()->state().growth_tracker, 7);
}

// A field of its piece that is missing or of another kind: one line naming the file and the field.
TEST(LossScaling, NamesTheFileAndTheFieldOfABadPiece) {
  FortyOneTokens data;
  LossScaling scaling(MixedPrecision::fp16, {}, data, 2);
  TrainingState state;
  state.scalars_file = "step-4/trainer_state.json";
  state.piece(LossScaling::kPiece).set_real("scale", 256.0);
  try {
    scaling.restore(state);
    FAIL() << "restored without a growth tracker";
  } catch (const gradaccum::Error& e) {
    EXPECT_STREQ(e.what(), "step-4/trainer_state.json: missing field 'loss_scaling.growth_tracker'");
  }
  state.piece(LossScaling::kPiece).set_text("growth_tracker", "7");
  try {
    scaling.restore(state);
    FAIL() << "restored a growth tracker that is a string";
  } catch (const gradaccum::Error& e) {
    EXPECT_STREQ(e.what(),
                 "step-4/trainer_state.json: field 'loss_scaling.growth_tracker' has the wrong type (an integer "
                 "expected)");
  }
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
  inside.piece(LossScaling::kPiece).set_real("scale", 65536.0);
  inside.piece(LossScaling::kPiece).set_integer("growth_tracker", 0);
  EXPECT_THROW(none.restore(inside), gradaccum::Error);
  inside.position.micro_step = 0;  // between windows: the new run's scaler starts afresh
  EXPECT_NO_THROW(none.restore(inside));
}

}  // namespace loss_scaling_test
