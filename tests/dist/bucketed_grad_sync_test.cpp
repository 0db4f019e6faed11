// The reducer on two in-process ranks (Gloo over a shared HashStore): every
// .grad is a view into its bucket (the gradients are held once), a window of
// two micro-steps ends with the sum over ranks in .grad and in the loss totals, and a .grad set to
// none or replaced between windows is pointed back at its view.
#include "gradaccum/dist/bucketed_grad_sync.h"

#include <gtest/gtest.h>

#include "in_process_ranks.h"

namespace bucketed_grad_sync_test {

using gradaccum::dist::BucketedGradSync;

constexpr int kWorld = 2;

// 10, 7 and 6 float64 elements (80, 56, 48 bytes). Buckets of 104 bytes fill
// in reverse order: {third, second} and {first}.
std::vector<torch::Tensor> make_params() {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  return {torch::zeros({2, 5}, f64).requires_grad_(), torch::zeros({7}, f64).requires_grad_(),
          torch::zeros({3, 2}, f64).requires_grad_()};
}

// One micro-step whose gradient is known: d/dp Σ p·(rank+1)·(1, 2, 3, ...) .
void micro_step(BucketedGradSync& sync, std::vector<torch::Tensor>& params, int rank, bool last) {
  sync.before_backward(last);
  auto loss = torch::zeros({}, torch::kDouble);
  for (auto& p : params) {
    const auto weights = (rank + 1) * torch::arange(1, p.numel() + 1, p.options().requires_grad(false));
    loss = loss + (p * weights.view_as(p)).sum();
  }
  loss.backward();
  sync.after_backward(last);
}

struct RankRun {
  std::vector<const void*> storages;  // each .grad's storage after attaching
  std::vector<torch::Tensor> summed;  // .grad after the window
  torch::Tensor totals;               // the window's loss totals after finish_window
  int64_t calls = 0;
  bool reattached_to_same_memory = false;
  double replaced_value = 0.0;  // a replaced .grad, after re-attaching
};

TEST(BucketedGradSync, GradientsAreBucketViewsAndHoldTheSumOverRanks) {
  std::vector<RankRun> runs(kWorld);
  gradaccum::testing::run_on_ranks(kWorld, [&](const auto& group, int rank) {
    auto params = make_params();
    gradaccum::dist::GradSyncOptions sync_options;
    sync_options.bucket_bytes = 104;
    BucketedGradSync sync(group, params, sync_options);
    auto& run = runs[rank];
    micro_step(sync, params, rank, /*last=*/false);
    for (auto& p : params) run.storages.push_back(p.grad().storage().data());
    micro_step(sync, params, rank, /*last=*/true);
    // This rank's [Σ loss sums, Σ counts, Σ naive terms] (and the stop flag the Trainer appends).
    auto totals =
        torch::tensor({1.5 * (rank + 1), 10.0 * (rank + 1), 0.25 + rank, rank == 1 ? 1.0 : 0.0}, torch::kDouble);
    sync.finish_window(totals);
    run.totals = totals.clone();
    run.calls = sync.allreduce_calls();
    for (auto& p : params) run.summed.push_back(p.grad().clone());

    // What the step sequence does between windows (set_to_none), and a
    // .grad replaced by other code: both go back into the buckets.
    params[1].mutable_grad() = torch::Tensor();
    params[0].mutable_grad() = torch::full({2, 5}, 5.0, torch::kDouble);
    sync.before_backward(false);
    run.reattached_to_same_memory = params[1].grad().storage().data() == run.storages[1] &&
                                    params[0].grad().storage().data() == run.storages[0] &&
                                    params[1].grad().abs().sum().item<double>() == 0.0;
    run.replaced_value = params[0].grad().mean().item<double>();
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    const auto& run = runs[rank];
    // Two buckets: {third, second} share one buffer, the first has its own.
    EXPECT_EQ(run.storages[1], run.storages[2]) << "rank " << rank;
    EXPECT_NE(run.storages[0], run.storages[1]) << "rank " << rank;
    EXPECT_EQ(run.calls, 2) << "rank " << rank;
    // Σ over 2 micro-steps and 2 ranks of (rank + 1)·(1, 2, ...) = 6·(1, 2, ...).
    for (size_t k = 0; k < run.summed.size(); ++k) {
      const auto expected = 6.0 * torch::arange(1, run.summed[k].numel() + 1, torch::kDouble);
      EXPECT_TRUE(torch::equal(run.summed[k].reshape(-1), expected)) << "rank " << rank << " param " << k;
    }
    // The loss totals are summed over ranks in place, on every rank.
    EXPECT_TRUE(torch::equal(run.totals, torch::tensor({4.5, 30.0, 1.5, 1.0}, torch::kDouble)))
        << "rank " << rank << ": " << run.totals;
    EXPECT_TRUE(run.reattached_to_same_memory) << "rank " << rank;
    EXPECT_EQ(run.replaced_value, 5.0) << "rank " << rank;
  }
}

}  // namespace bucketed_grad_sync_test
