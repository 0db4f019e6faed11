// The CUDA path: training on a CUDA device follows the CPU's and the full batch's trajectory
// (float64), the masked LM loss gives the CPU's sums and gradients, batches reach the device
// through pinned memory, and two NCCL ranks equal one process. Every test skips, naming the
// reason, where no CUDA device is visible or the build links libtorch's CPU libraries only
// (configure with -DGRADACCUM_WITH_CUDA=ON). CI compiles this file in both builds.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <thread>

#include "gradaccum/dist/process_group.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/gpt2.h"
#include "padded_batches.h"
#include "test_support.h"
#include "tiny_decoders.h"

namespace {

using namespace gradaccum;

// "" when a CUDA device can run these tests, else why not.
std::string cuda_unavailable() {
#ifndef GRADACCUM_WITH_CUDA
  return "this build links libtorch's CPU libraries only (configure with -DGRADACCUM_WITH_CUDA=ON)";
#else
  if (!torch::cuda::is_available()) return "no CUDA device is visible";
  return "";
#endif
}

#define SKIP_WITHOUT_CUDA()                                            \
  do {                                                                 \
    if (const auto reason = cuda_unavailable(); !reason.empty()) {     \
      GTEST_SKIP() << reason;                                          \
    }                                                                  \
  } while (false)

using gradaccum::testing::Trajectory;

// Seed 000's MLP in float64 on `device`, b × n over 60 samples for 12 steps (crossing the
// epoch's partial window), as tests/accumulation_test.cpp trains it on the CPU.
Trajectory train_mlp(const torch::Device& device, int64_t b, int64_t n) {
  return gradaccum::testing::train_seed000_mlp(b, n, 60, 12, device);
}

void expect_same_trajectory(const Trajectory& a, const Trajectory& b, double tolerance,
                            const std::string& what) {
  ASSERT_EQ(a.loss.size(), b.loss.size()) << what;
  for (size_t i = 0; i < a.loss.size(); ++i) {
    EXPECT_NEAR(a.loss[i], b.loss[i], tolerance * std::abs(b.loss[i])) << what << " step " << i;
    EXPECT_NEAR(a.grad_norm[i], b.grad_norm[i], tolerance * b.grad_norm[i]) << what << " step " << i;
  }
  EXPECT_LE(gradaccum::testing::max_relative_difference(a.weights, b.weights), tolerance) << what;
}

TEST(GpuTraining, DecompositionsOnCudaFollowTheFullBatchAndTheCpu) {
  SKIP_WITHOUT_CUDA();
  const auto full_batch = train_mlp(torch::kCUDA, 8, 1);
  ASSERT_EQ(full_batch.loss.size(), 12u);
  for (auto [b, n] : std::vector<std::pair<int64_t, int64_t>>{{4, 2}, {1, 8}}) {
    expect_same_trajectory(train_mlp(torch::kCUDA, b, n), full_batch, 1e-10,
                           std::to_string(b) + "x" + std::to_string(n) + " on CUDA");
  }
  expect_same_trajectory(train_mlp(torch::kCPU, 2, 4), full_batch, 1e-10, "2x4 on the CPU");
}

// The fused LM-head loss with padding labelled -100, on CUDA against the CPU in float64: the
// same sum, the same count of targets, the same gradients.
TEST(GpuLmLoss, MaskedFusedLossOnCudaEqualsTheCpu) {
  SKIP_WITHOUT_CUDA();
  const auto data = gradaccum::testing::pad(gradaccum::testing::make_sequences({5, 9, 3, 12}, 7), false);
  const auto labels = data.ids.masked_fill(data.mask == 0, models::kIgnoreIndex);
  auto run = [&](const torch::Device& device) {
    models::CausalLm model{models::Gpt2LmHeadModel(gradaccum::testing::tiny_gpt2_config())};
    model.module().to(device, torch::kDouble);
    auto l = model.loss({data.ids.to(device), labels.to(device), data.mask.to(device), 4});
    l.sum.backward();
    return std::make_tuple(l.sum.item<double>(), l.count.item<double>(),
                           gradaccum::testing::flat_grads(model.module()).cpu());
  };
  const auto [cpu_sum, cpu_count, cpu_grads] = run(torch::kCPU);
  const auto [cuda_sum, cuda_count, cuda_grads] = run(torch::kCUDA);
  EXPECT_EQ(cuda_count, cpu_count);
  EXPECT_EQ(cpu_count, (5 - 1) + (9 - 1) + (3 - 1) + (12 - 1));
  EXPECT_NEAR(cuda_sum, cpu_sum, 1e-12 * std::abs(cpu_sum));
  EXPECT_LE(gradaccum::testing::max_relative_difference(cuda_grads, cpu_grads), 1e-10);
}

// The trainer copies each batch to the device from page-locked memory (core/trainer.cpp): a
// pinned copy queued on the stream arrives intact.
TEST(GpuPinnedCopies, PinnedNonBlockingCopiesArriveIntact) {
  SKIP_WITHOUT_CUDA();
  const auto host = torch::arange(1 << 20, torch::kDouble).pin_memory();
  ASSERT_TRUE(host.is_pinned());
  const auto device = host.to(torch::kCUDA, /*non_blocking=*/true);
  EXPECT_TRUE(torch::equal(device.cpu(), host));
}

// Two NCCL ranks in threads, one GPU each, all-reduce a tensor whose sum is known.
TEST(GpuNccl, TwoRanksAllReduce) {
  SKIP_WITHOUT_CUDA();
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "fewer than two CUDA devices are visible";
#ifdef GRADACCUM_WITH_CUDA
  std::vector<double> sums(2);
  std::vector<std::thread> ranks;
  const int port = 29640;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      dist::DistEnvironment env;
      env.rank = rank;
      env.world_size = 2;
      env.local_rank = rank;
      env.local_world_size = 2;
      env.master_port = port;
      auto connection =
          dist::connect(env, std::chrono::seconds(60), c10::Device(torch::kCUDA, rank));
      std::vector<torch::Tensor> tensors{
          torch::full({4}, rank + 1.0, torch::TensorOptions(torch::kDouble).device(torch::kCUDA, rank))};
      connection.group->allreduce(tensors)->wait();
      sums[rank] = tensors[0].sum().item<double>();
    });
  }
  for (auto& r : ranks) r.join();
  EXPECT_EQ(sums[0], 4 * 3.0);
  EXPECT_EQ(sums[1], 4 * 3.0);
#endif
}

}  // namespace
