// core/window_totals.h: the window's cross-rank record round-trips field by field, sums over
// ranks field by field (two in-process Gloo ranks), and refuses a vector of the wrong size.
#include "gradaccum/core/window_totals.h"

#include <gtest/gtest.h>

#include <vector>

#include "gradaccum/base/check.h"
#include "in_process_ranks.h"

namespace window_totals_test {

using gradaccum::core::host_value;
using gradaccum::core::WindowTotals;
using gradaccum::core::WindowTotalsLayout;

torch::Tensor doubles(std::vector<double> values) { return torch::tensor(values, torch::kDouble); }

// Rank `rank`'s totals of a window with 3 micro-steps on 2 ranks, every value distinct, with
// (`slots` > 0) deterministic accumulation's slot figures.
WindowTotals rank_totals(int64_t rank, int64_t slots) {
  const double r = static_cast<double>(rank);
  WindowTotals t;
  t.loss = doubles({10.5 + r, 4.0 + r, 0.25 * r});
  t.stop_requests = torch::full({}, rank == 1 ? 1.0 : 0.0, torch::kDouble);
  t.out_of_memory_ranks = torch::zeros({}, torch::kDouble);
  t.save_requests = torch::full({}, 1.0, torch::kDouble);  // both ranks' clocks say a save is due
  t.micro_step_items = doubles({1.0 + r, 2.0 + r, 3.0 + r});
  t.rank_items = torch::zeros({2}, torch::kDouble);
  t.rank_items[rank] = 4.0 + r;
  if (slots > 0) {
    t.slot_loss_sums = torch::zeros({slots}, torch::kDouble);
    t.slot_counts = torch::zeros({slots}, torch::kDouble);
    for (int64_t s = 0; s < slots / 2; ++s) {
      t.slot_loss_sums[rank * (slots / 2) + s] = 100.0 * (r + 1) + static_cast<double>(s);
      t.slot_counts[rank * (slots / 2) + s] = 10.0 * (r + 1) + static_cast<double>(s);
    }
  }
  return t;
}

void expect_same(const WindowTotals& a, const WindowTotals& b) {
  EXPECT_TRUE(torch::equal(a.loss, b.loss));
  EXPECT_TRUE(torch::equal(a.stop_requests, b.stop_requests));
  EXPECT_TRUE(torch::equal(a.out_of_memory_ranks, b.out_of_memory_ranks));
  EXPECT_TRUE(torch::equal(a.save_requests, b.save_requests));
  EXPECT_TRUE(torch::equal(a.micro_step_items, b.micro_step_items));
  EXPECT_TRUE(torch::equal(a.rank_items, b.rank_items));
  ASSERT_EQ(a.slot_loss_sums.defined(), b.slot_loss_sums.defined());
  if (a.slot_loss_sums.defined()) {
    EXPECT_TRUE(torch::equal(a.slot_loss_sums, b.slot_loss_sums));
    EXPECT_TRUE(torch::equal(a.slot_counts, b.slot_counts));
  }
}

TEST(WindowTotals, PackAndUnpackRoundTripEveryField) {
  for (const int64_t slots : {0, 6}) {
    const auto totals = rank_totals(1, slots);
    const auto layout = totals.layout();
    EXPECT_EQ(layout.micro_steps, 3);
    EXPECT_EQ(layout.world_size, 2);
    EXPECT_EQ(layout.slots, slots);
    const auto packed = totals.pack();
    ASSERT_EQ(packed.dim(), 1);
    EXPECT_EQ(packed.numel(), 3 + 3 + 3 + 2 + 2 * slots);
    EXPECT_EQ(packed.numel(), layout.packed_size());
    EXPECT_EQ(packed.scalar_type(), torch::kDouble);
    const auto back = WindowTotals::unpack(packed, layout);
    expect_same(back, totals);
    EXPECT_EQ(back.layout(), layout);
    EXPECT_EQ(host_value(back.stop_requests), 1.0);
  }
}

// unpack() hands back views: a piece that rewrites a field after the reduce (deterministic
// accumulation's canonical loss sum) rewrites the packed vector the record is read from.
TEST(WindowTotals, UnpackedFieldsAreViewsOfThePackedVector) {
  const auto totals = rank_totals(0, 4);
  auto packed = totals.pack();
  auto fields = WindowTotals::unpack(packed, totals.layout());
  fields.loss.narrow(0, 0, 1).fill_(-7.0);
  fields.out_of_memory_ranks.fill_(2.0);
  EXPECT_EQ(packed[0].item<double>(), -7.0);
  EXPECT_EQ(packed[4].item<double>(), 2.0);
  EXPECT_EQ(fields.pack()[0].item<double>(), -7.0);
}

// Summed over two ranks, each field holds the sum of the ranks' fields: a flag becomes the
// number of ranks that raised it, and the per-rank vector every rank's figure.
TEST(WindowTotals, AllReducedFieldsAreTheRanksSums) {
  constexpr int64_t kSlots = 6;
  std::vector<WindowTotals> reduced(2);
  gradaccum::testing::run_on_ranks(2, [&](const c10::intrusive_ptr<c10d::Backend>& group, int rank) {
    const auto mine = rank_totals(rank, kSlots);
    std::vector<torch::Tensor> packed{mine.pack()};
    group->allreduce(packed)->wait();
    reduced[static_cast<size_t>(rank)] = WindowTotals::unpack(packed[0], mine.layout());
  });
  const auto a = rank_totals(0, kSlots), b = rank_totals(1, kSlots);
  for (const auto& r : reduced) {
    EXPECT_TRUE(torch::equal(r.loss, a.loss + b.loss));
    EXPECT_EQ(host_value(r.stop_requests), 1.0);
    EXPECT_EQ(host_value(r.out_of_memory_ranks), 0.0);
    EXPECT_EQ(host_value(r.save_requests), 2.0);
    EXPECT_TRUE(torch::equal(r.micro_step_items, doubles({3.0, 5.0, 7.0})));
    EXPECT_TRUE(torch::equal(r.rank_items, doubles({4.0, 5.0})));
    EXPECT_TRUE(torch::equal(r.slot_loss_sums, doubles({100, 101, 102, 200, 201, 202})));
    EXPECT_TRUE(torch::equal(r.slot_counts, doubles({10, 11, 12, 20, 21, 22})));
  }
}

TEST(WindowTotals, RefusesAVectorOfAnotherLayout) {
  const auto totals = rank_totals(0, 0);
  auto layout = totals.layout();
  layout.world_size = 4;
  try {
    WindowTotals::unpack(totals.pack(), layout);
    FAIL() << "a vector of 11 values was read as a layout of 13";
  } catch (const gradaccum::Error& e) {
    EXPECT_STREQ(e.what(), "window totals: 11 values where the layout (3 micro-steps, 4 ranks, 0 slots) holds 13");
  }
}

}  // namespace window_totals_test
