// core/preemption.h on its own: where a window stops between micro-steps, what the stopped
// window leaves for its checkpoint (its piece of the state, and back), the stop request riding in
// the window's totals, and the states it refuses to continue. The whole run through signals and checkpoints is checked
// in tests/io/checkpoint_test.cpp (bit-identical resume inside a window).
#include "gradaccum/core/preemption.h"

#include <gtest/gtest.h>

#include <atomic>

#include "gradaccum/base/check.h"

namespace preemption_test {

using namespace gradaccum::core;

struct Fixture {
  // 8 samples in windows of 2 × 4 on one process.
  WindowPlan plan{8, BatchGeometry::from_accumulation(2, 4, 1), LastWindow::partial, 7, SampleOrder::random};
  Window window = plan.window(plan.permutation(0), 0, 0);
  torch::Tensor weight = torch::zeros({3}, torch::kDouble).requires_grad_();
  LossNormalizer normalizer{LossNormalization::window, 4};
  std::atomic<bool> stop{false};
  LocalStopAgreement agreement;

  // Runs micro-steps until `preemption` stops the window (or all ran); micro-step s adds s + 1
  // to every gradient and counts 2 items. Returns the micro-step it stopped before (-1: none).
  int64_t run(Preemption& preemption, WindowState& w, int64_t stop_after) {
    normalizer.begin_window();
    preemption.begin_window(w);
    for (int64_t s = w.first_micro_step; s < window.micro_steps(); ++s) {
      if (s == stop_after) stop = true;
      if (preemption.stop_before_micro_step(w, s, s + 1 == window.micro_steps())) return s;
      const auto loss = (weight * static_cast<double>(s + 1)).sum();
      normalizer.objective({loss, torch::tensor(int64_t{2})}).backward();
      w.micro_items.push_back(torch::tensor(2.0, torch::kDouble));
    }
    return -1;
  }
};

TEST(Preemption, StopsAtTheNextBoundaryAndKeepsThePartialWindow) {
  Fixture f;
  Preemption preemption({f.weight}, f.normalizer, torch::kCPU, /*inside_windows=*/true);
  preemption.arm(&f.stop, &f.agreement);
  WindowState w(f.window, 0, 0);
  w.stoppable = true;
  EXPECT_EQ(f.run(preemption, w, /*stop_after=*/2), 2);  // asked before micro-step 2: stops there

  TrainingState state;
  preemption.save(state);
  EXPECT_EQ(state.position.micro_step, 2);
  const auto partial = Preemption::partial_window(state);
  EXPECT_EQ(partial.micro_step, 2);
  ASSERT_EQ(partial.grads.size(), 1u);
  EXPECT_TRUE(torch::equal(partial.grads[0], torch::full({3}, 3.0, torch::kDouble)));  // 1 + 2
  EXPECT_TRUE(torch::equal(partial.totals, torch::tensor({0.0, 4.0, 0.0}, torch::kDouble)));
  EXPECT_TRUE(torch::equal(partial.micro_items, torch::tensor({2.0, 2.0}, torch::kDouble)));
}

TEST(Preemption, AWindowThatCannotBeSavedRunsToItsEnd) {
  // Deterministic accumulation's tree (inside_windows false), or a caller that cannot save.
  for (const bool inside_windows : {false, true}) {
    Fixture f;
    Preemption preemption({f.weight}, f.normalizer, torch::kCPU, inside_windows);
    preemption.arm(&f.stop, &f.agreement);
    WindowState w(f.window, 0, 0);
    w.stoppable = !inside_windows;
    EXPECT_EQ(f.run(preemption, w, 1), -1);
    TrainingState state;
    preemption.save(state);
    EXPECT_EQ(state.position.micro_step, 0);
    EXPECT_TRUE(state.pieces.empty());
  }
}

TEST(Preemption, TheRequestRidesInTheTotalsAndStopsTheRunAfterTheStep) {
  Fixture f;
  Preemption preemption({f.weight}, f.normalizer, torch::kCPU, true);
  preemption.arm(&f.stop, nullptr);  // several ranks without an agreement: only at the window's end
  WindowState w(f.window, 0, 0);
  w.stoppable = true;
  EXPECT_EQ(f.run(preemption, w, 1), -1);
  WindowTotals totals;
  totals.stop_requests = torch::zeros({}, torch::kDouble);
  preemption.contribute(totals, w);
  EXPECT_EQ(host_value(totals.stop_requests), 1.0);
  EXPECT_FALSE(preemption.stop_agreed());
  preemption.after_host_read(totals);
  EXPECT_TRUE(preemption.stop_agreed());
}

TEST(Preemption, AResumedWindowGetsItsSumsBack) {
  Fixture f;
  TrainingState saved;
  {
    Preemption first({f.weight}, f.normalizer, torch::kCPU, true);
    first.arm(&f.stop, &f.agreement);
    WindowState w(f.window, 0, 0);
    w.stoppable = true;
    ASSERT_EQ(f.run(first, w, 3), 3);
    first.save(saved);
  }
  f.weight.mutable_grad() = torch::Tensor();
  f.stop = false;
  Preemption resumed({f.weight}, f.normalizer, torch::kCPU, true);
  resumed.restore(saved);
  EXPECT_EQ(resumed.resumed_micro_step(), 3);
  WindowState w(f.window, 0, resumed.resumed_micro_step());
  EXPECT_EQ(f.run(resumed, w, -1), -1);
  EXPECT_TRUE(torch::equal(f.weight.grad(), torch::full({3}, 10.0, torch::kDouble)));  // 1 + 2 + 3 + 4
  EXPECT_TRUE(torch::equal(f.normalizer.local_totals(), torch::tensor({0.0, 8.0, 0.0}, torch::kDouble)));
  EXPECT_EQ(w.micro_items.size(), 4u);
}

std::string refusal(Preemption& preemption, const TrainingState& state) {
  try {
    preemption.restore(state);
  } catch (const gradaccum::Error& e) {
    return e.what();
  }
  return "(accepted)";
}

// Its piece's tensors give back the fields it saved, an undefined gradient (no gradient yet)
// included.
TEST(Preemption, APartialWindowRoundTripsThroughItsPiece) {
  PartialWindow partial;
  partial.micro_step = 3;
  partial.totals = torch::tensor({1.5, 6.0, 0.25}, torch::kDouble);
  partial.micro_items = torch::tensor({2.0, 2.0, 2.0}, torch::kDouble);
  partial.grads = {torch::full({3}, 7.0, torch::kDouble), torch::Tensor(), torch::ones({2, 2})};
  TrainingState state;
  state.position.micro_step = 3;
  partial.save(state.piece(Preemption::kPiece));
  EXPECT_EQ(state.piece(Preemption::kPiece).tensors.size(), 6u);  // micro_step, grad_count, totals, items, 2 grads
  const auto back = Preemption::partial_window(state);
  EXPECT_EQ(back.micro_step, 3);
  EXPECT_TRUE(torch::equal(back.totals, partial.totals));
  EXPECT_TRUE(torch::equal(back.micro_items, partial.micro_items));
  ASSERT_EQ(back.grads.size(), 3u);
  EXPECT_TRUE(torch::equal(back.grads[0], partial.grads[0]));
  EXPECT_FALSE(back.grads[1].defined());
  EXPECT_TRUE(torch::equal(back.grads[2], partial.grads[2]));
}

// A state saved inside a window whose partial window was saved on one parameter, read back from
// window-rank0.safetensors.
TrainingState inside_a_window(int64_t grads) {
  PartialWindow partial;
  partial.micro_step = 2;
  partial.totals = torch::zeros({3}, torch::kDouble);
  partial.grads.resize(static_cast<size_t>(grads));
  TrainingState state;
  state.position.micro_step = 2;
  state.tensors_file = "step-2/window-rank0.safetensors";
  partial.save(state.piece(Preemption::kPiece));
  return state;
}

TEST(Preemption, RefusesStatesItCannotContinue) {
  Fixture f;
  Preemption preemption({f.weight}, f.normalizer, torch::kCPU, true);
  auto state = inside_a_window(2);
  EXPECT_EQ(refusal(preemption, state), "checkpoint: the partial window holds 2 gradients for 1 parameters");
  Preemption tree({f.weight}, f.normalizer, torch::kCPU, /*inside_windows=*/false);
  EXPECT_EQ(refusal(tree, state),
            "checkpoint: it was saved inside a window (micro-step 2), whose sums this run cannot continue "
            "(deterministic_accumulation's tree order, or zero_stage 2's sharded_grad_sync: each_micro_step); "
            "resume it without them");
  state = inside_a_window(1);
  EXPECT_EQ(refusal(preemption, state), "(accepted)");

  // Its tensors, each checked, in one line naming the file and the tensor.
  auto& piece = state.piece(Preemption::kPiece);
  piece.tensors.erase("totals");
  EXPECT_EQ(refusal(preemption, state), "step-2/window-rank0.safetensors: missing tensor 'preemption.totals'");
  piece.set_tensor("totals", torch::zeros({3}, torch::kFloat));
  EXPECT_EQ(refusal(preemption, state),
            "step-2/window-rank0.safetensors: tensor 'preemption.totals' is not 3 float64 sums");
  piece.set_tensor("totals", torch::zeros({3}, torch::kDouble));
  piece.set_tensor("micro_step", torch::zeros({1}, torch::kDouble));
  EXPECT_EQ(refusal(preemption, state),
            "step-2/window-rank0.safetensors: tensor 'preemption.micro_step' is not one int64");
  piece.set_tensor("micro_step", torch::full({1}, 2, torch::kLong));
  piece.set_tensor("micro_items", torch::ones({3}, torch::kDouble));
  EXPECT_EQ(refusal(preemption, state),
            "step-2/window-rank0.safetensors: tensor 'preemption.micro_items' is not 2 float64 counts");
  piece.tensors.erase("micro_items");
  piece.set_tensor("grad.00001", torch::ones({3}, torch::kDouble));
  EXPECT_EQ(refusal(preemption, state),
            "step-2/window-rank0.safetensors: tensor 'preemption.grad.00001' is beyond grad_count 1");
  piece.tensors.erase("grad.00001");
  piece.set_tensor("grad.x", torch::ones({3}, torch::kDouble));
  EXPECT_EQ(refusal(preemption, state),
            "step-2/window-rank0.safetensors: tensor 'preemption.grad.x' has no gradient index");
}

}  // namespace preemption_test
