// core/saved_geometry.h: the Trainer's piece of a checkpoint (b × N × W, the global batch,
// window_tokens) saved and read back, and the states it refuses to continue.
#include "gradaccum/core/saved_geometry.h"

#include <gtest/gtest.h>

#include "gradaccum/base/check.h"
#include "test_support.h"

namespace saved_geometry_test {

using namespace gradaccum::core;

using gradaccum::testing::error_of;  // "" when nothing is thrown

TEST(SavedGeometry, RoundTripsThroughItsPiece) {
  TrainingState state;
  SavedGeometry{BatchGeometry::from_accumulation(4, 8, 2), 150}.save(state);
  const auto piece = state.saved_piece(SavedGeometry::kPiece);
  EXPECT_EQ(piece.scalars.size(), 5u);
  EXPECT_EQ(piece.integer("global_batch"), 64);
  const auto back = SavedGeometry::restore(state);
  EXPECT_EQ(back.geometry.micro_batch(), 4);
  EXPECT_EQ(back.geometry.accumulation_steps(), 8);
  EXPECT_EQ(back.geometry.world_size(), 2);
  EXPECT_EQ(back.window_tokens, 150);
}

TEST(SavedGeometry, RefusesAPieceNoRunSaved) {
  TrainingState state;
  state.scalars_file = "step-2/trainer_state.json";
  EXPECT_EQ(error_of([&] { SavedGeometry::restore(state); }),
            "step-2/trainer_state.json: missing field 'geometry.micro_batch'");
  SavedGeometry{BatchGeometry::from_accumulation(4, 8, 2), 0}.save(state);
  auto& piece = state.piece(SavedGeometry::kPiece);
  piece.set_integer("global_batch", 65);
  EXPECT_EQ(error_of([&] { SavedGeometry::restore(state); }),
            "step-2/trainer_state.json: field 'geometry.global_batch' is 65, not micro_batch x accumulation_steps x "
            "world_size = 4 x 8 x 2 = 64");
  piece.set_integer("global_batch", 64);
  piece.set_real("world_size", 2.0);
  EXPECT_EQ(error_of([&] { SavedGeometry::restore(state); }),
            "step-2/trainer_state.json: field 'geometry.world_size' has the wrong type (an integer expected)");
  piece.set_integer("world_size", 2);
  piece.set_integer("window_tokens", -1);
  EXPECT_EQ(error_of([&] { SavedGeometry::restore(state); }),
            "step-2/trainer_state.json: field 'geometry.window_tokens' is negative");
  piece.set_integer("window_tokens", 0);
  piece.set_integer("micro_batch", 0);
  EXPECT_NE(error_of([&] { SavedGeometry::restore(state); }).find("step-2/trainer_state.json: "), std::string::npos);
}

TEST(SavedGeometry, ContinuesOnlyWhatKeepsTheWindows) {
  TrainingState state;
  const SavedGeometry saved{BatchGeometry::from_accumulation(1, 8, 1), 0};
  // Between windows: any decomposition of the same global batch.
  EXPECT_EQ(error_of([&] { saved.check_continues(state, BatchGeometry::from_accumulation(2, 4, 1), 0); }), "");
  EXPECT_EQ(error_of([&] { saved.check_continues(state, BatchGeometry::from_accumulation(2, 8, 1), 0); }),
            "checkpoint: it was saved with global batch 8 and this run has 16");
  EXPECT_EQ(error_of([&] { saved.check_continues(state, BatchGeometry::from_accumulation(2, 4, 1), 40); }),
            "checkpoint: it was saved with window_tokens 0 and this run has 40");
  // Inside a window: its partial sums continue under the same b, N and W only (another
  // decomposition trains the window again).
  state.position.micro_step = 2;
  EXPECT_EQ(error_of([&] { saved.check_continues(state, BatchGeometry::from_accumulation(2, 4, 1), 0); }), "");
  EXPECT_TRUE(saved.continues_inside_window(BatchGeometry::from_accumulation(1, 8, 1)));
  EXPECT_FALSE(saved.continues_inside_window(BatchGeometry::from_accumulation(2, 4, 1)));
  EXPECT_FALSE(saved.continues_inside_window(BatchGeometry::from_accumulation(1, 4, 2)));
}

TEST(SavedGeometry, RefusesAPositionNoRunReaches) {
  TrainingState state;
  state.scalars_file = "trainer_state.json";
  state.position.step = 2;
  const SavedGeometry saved{BatchGeometry::from_accumulation(16, 4, 1), 0};
  EXPECT_EQ(error_of([&] { saved.check_position_is_possible(state); }), "");
  state.position.samples = 193;  // 3 windows of 64 hold 192
  EXPECT_EQ(error_of([&] { saved.check_position_is_possible(state); }),
            "trainer_state.json: samples 193 is more than 3 windows of 64 samples hold");
  state.position.samples = 0;
  state.position.epoch = 3;
  const SavedGeometry tokens{BatchGeometry::from_accumulation(16, 4, 1), 150};
  EXPECT_EQ(error_of([&] { tokens.check_position_is_possible(state); }),
            "trainer_state.json: epoch 3 is impossible after 2 windows");
}

}  // namespace saved_geometry_test
