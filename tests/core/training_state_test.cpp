// core/training_state.h and core/piece_state.h: a piece's fields by name and kind, and the
// one-line errors naming the file and the field when one is missing or of another kind.
#include "gradaccum/core/training_state.h"

#include <gtest/gtest.h>

#include "gradaccum/base/check.h"
#include "test_support.h"

namespace training_state_test {

using namespace gradaccum::core;

using gradaccum::testing::error_of;  // "" when nothing is thrown

TEST(PieceState, GivesBackEachKindByName) {
  TrainingState state;
  auto& piece = state.piece("example");
  piece.set_integer("count", -7);
  piece.set_real("ratio", 0.1);
  piece.set_flag("on", true);
  piece.set_text("label", "b x N x W");
  piece.set_tensor("sums", torch::tensor({1.0, 2.0}, torch::kDouble));
  const auto saved = state.saved_piece("example");
  EXPECT_EQ(saved.integer("count"), -7);
  EXPECT_EQ(saved.real("ratio"), 0.1);
  EXPECT_EQ(saved.real("count"), -7.0);  // an integer reads as a real too
  EXPECT_TRUE(saved.flag("on"));
  EXPECT_EQ(saved.text("label"), "b x N x W");
  EXPECT_TRUE(torch::equal(saved.tensor("sums"), torch::tensor({1.0, 2.0}, torch::kDouble)));
  EXPECT_FALSE(saved.has("other"));
  EXPECT_TRUE(state.saved_piece("nobody").scalars.empty());
}

TEST(PieceState, NamesTheFileAndTheFieldOfWhatIsMissingOrOfAnotherKind) {
  TrainingState state;
  state.scalars_file = "step-3/trainer_state.json";
  state.tensors_file = "step-3/window-rank1.safetensors";
  state.piece("example").set_text("count", "7");
  state.piece("example").set_tensor("step", torch::ones({2}, torch::kLong));
  const auto saved = state.saved_piece("example");
  EXPECT_EQ(error_of([&] { saved.integer("count"); }),
            "step-3/trainer_state.json: field 'example.count' has the wrong type (an integer expected)");
  EXPECT_EQ(error_of([&] { saved.real("count"); }),
            "step-3/trainer_state.json: field 'example.count' has the wrong type (a number expected)");
  EXPECT_EQ(error_of([&] { saved.flag("count"); }),
            "step-3/trainer_state.json: field 'example.count' has the wrong type (true or false expected)");
  EXPECT_EQ(error_of([&] { saved.text("other"); }), "step-3/trainer_state.json: missing field 'example.other'");
  EXPECT_EQ(error_of([&] { saved.tensor("other"); }),
            "step-3/window-rank1.safetensors: missing tensor 'example.other'");
  EXPECT_EQ(error_of([&] { saved.tensor_integer("step"); }),
            "step-3/window-rank1.safetensors: tensor 'example.step' is not one int64");
}

}  // namespace training_state_test
