// deterministic_accumulation (core/canonical_sum.h, dist/tree_grad_sync.h): the canonical tree
// as documented, streaming sums equal to it and split across ranks the same way, the contiguous
// chunk order, and float32 runs bit-identical for (N, W) = (8, 1), (4, 2), (2, 4) and across a
// resume onto another decomposition, while without the option they differ.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <random>

#include "gradaccum/core/canonical_sum.h"
#include "gradaccum/core/window_plan.h"
#include "test_support.h"

namespace deterministic_accumulation_test {

namespace fs = std::filesystem;
using gradaccum::core::canonical_sum;
using gradaccum::core::CanonicalGradientSum;
using gradaccum::testing::make_temp_dir;
using gradaccum::testing::read_jsonl;
using gradaccum::testing::read_text;
using gradaccum::testing::run_cli;

TEST(CanonicalSum, FollowsTheDocumentedTree) {
  // Six slots = 2 × 3: blocks [0, 3) and [3, 6), each left to right, then added. In float64,
  // 1e16 + 1 rounds back to 1e16 (its spacing is 2), so the order shows in the result.
  const std::vector<double> values{1e16, 1.0, 1.0, -1e16, 1.0, 1.0};
  const std::vector<bool> all(6, true);
  EXPECT_EQ(*canonical_sum(values, all), 0.0);  // (1e16 + 1 + 1) + (-1e16 + 1 + 1) = 1e16 - 1e16
  double left_to_right = 0.0;
  for (double v : values) left_to_right += v;
  EXPECT_EQ(left_to_right, 2.0) << "the example must tell the orders apart";
  // Eight slots: a balanced binary tree, ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)).
  const std::vector<double> eight{1e16, 1.0, 1.0, 1.0, -1e16, 1.0, 1.0, 1.0};
  const double tree = ((1e16 + 1.0) + (1.0 + 1.0)) + ((-1e16 + 1.0) + (1.0 + 1.0));
  EXPECT_EQ(*canonical_sum(eight, std::vector<bool>(8, true)), tree);
  EXPECT_EQ(tree, 4.0);
  // Absent slots add nothing: not even +0 to a -0.
  const auto negative_zero = canonical_sum({-0.0, 0.0}, {true, false});
  ASSERT_TRUE(negative_zero.has_value());
  EXPECT_TRUE(std::signbit(*negative_zero));
  EXPECT_FALSE(canonical_sum({1.0, 2.0}, {false, false}).has_value());
  EXPECT_EQ(gradaccum::core::odd_part(12), 3);
  EXPECT_EQ(gradaccum::core::odd_part(16), 1);
}

TEST(CanonicalSum, DeviceTreeEqualsTheHostTreeBitForBit) {
  std::mt19937_64 random(7);
  std::normal_distribution<double> normal(0.0, 1e3);
  for (int64_t n = 1; n <= 24; ++n) {
    std::vector<double> values(static_cast<size_t>(n));
    for (auto& v : values) v = normal(random);
    const auto device = canonical_sum(torch::tensor(values, torch::kDouble));
    EXPECT_EQ(device.item<double>(), *canonical_sum(values, std::vector<bool>(values.size(), true))) << n;
  }
}

// The canonical tree over float32 tensors, written out recursively (the definition).
torch::Tensor tree_of(const std::vector<torch::Tensor>& leaves, size_t begin, size_t end) {
  const size_t length = end - begin;
  if (length % 2 == 0) {
    return tree_of(leaves, begin, begin + length / 2) + tree_of(leaves, begin + length / 2, end);
  }
  auto sum = leaves[begin].clone();
  for (size_t i = begin + 1; i < end; ++i) sum = sum + leaves[i];
  return sum;
}

std::vector<torch::Tensor> random_leaves(int64_t count, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> leaves;
  for (int64_t i = 0; i < count; ++i) leaves.push_back(torch::randn({1000}) * std::pow(10.0, i % 5));
  return leaves;
}

TEST(CanonicalGradientSum, StreamsTheTreeAndSplitsItAcrossRanks) {
  for (const int64_t slots : {1, 3, 8, 12, 16, 24}) {
    SCOPED_TRACE(slots);
    const auto leaves = random_leaves(slots, 11);
    const auto expected = tree_of(leaves, 0, leaves.size());
    CanonicalGradientSum sum(slots);
    size_t most_held = 0;
    for (const auto& leaf : leaves) {
      sum.add({leaf.clone(), torch::Tensor()});  // a second parameter that never gets a gradient
      most_held = std::max(most_held, sum.held());
    }
    const auto root = sum.finish();
    ASSERT_EQ(root.size(), 2u);
    EXPECT_FALSE(root[1].defined());
    EXPECT_TRUE(torch::equal(root[0], expected));
    EXPECT_LE(most_held, static_cast<size_t>(std::log2(static_cast<double>(slots))) + 2);
    // W ranks (a power of two dividing the slots) of slots / W each: their roots, added in the
    // tree's top levels, give the same bits.
    for (int64_t world = 2; slots % world == 0 && world <= slots; world *= 2) {
      std::vector<torch::Tensor> roots;
      for (int64_t r = 0; r < world; ++r) {
        CanonicalGradientSum part(slots / world);
        for (int64_t s = 0; s < slots / world; ++s)
          part.add({leaves[static_cast<size_t>(r * slots / world + s)].clone()});
        roots.push_back(part.finish()[0]);
      }
      while (roots.size() > 1) {
        std::vector<torch::Tensor> next;
        for (size_t i = 0; i < roots.size(); i += 2) next.push_back(roots[i] + roots[i + 1]);
        roots = next;
      }
      EXPECT_TRUE(torch::equal(roots[0], expected)) << "W = " << world;
    }
    // Left to right differs (the leaves span five decades), or the test would prove nothing.
    if (slots >= 8) {
      auto sequential = leaves[0].clone();
      for (size_t i = 1; i < leaves.size(); ++i) sequential = sequential + leaves[i];
      EXPECT_FALSE(torch::equal(sequential, expected));
    }
  }
}

TEST(CanonicalGradientSum, SkippedSlotsAreAbsent) {
  const auto leaves = random_leaves(4, 3);
  CanonicalGradientSum sum(4);
  sum.add({leaves[0].clone()});
  sum.skip();
  sum.add({leaves[2].clone()});
  sum.skip();
  EXPECT_TRUE(torch::equal(sum.finish()[0], leaves[0] + leaves[2]));
  CanonicalGradientSum none(2);
  none.skip();
  none.skip();
  EXPECT_TRUE(none.finish().empty());
}

TEST(ChunkOrder, ContiguousGivesEachRankARunOfChunks) {
  // 30 samples, b = 4, N = 4, W = 2 (a partial window of B = 32): rank 0 holds chunks 0-3,
  // rank 1 chunks 4-7, the last of them the two samples 28 and 29.
  const auto geometry = gradaccum::core::BatchGeometry::from_accumulation(4, 4, 2);
  const gradaccum::core::Window w(0, 0, torch::arange(30, torch::kLong), geometry,
                                  gradaccum::core::ChunkOrder::contiguous);
  EXPECT_EQ(w.micro_steps(), 4);
  EXPECT_TRUE(torch::equal(w.micro_batch(1, 0), torch::arange(4, 8, torch::kLong)));
  EXPECT_TRUE(torch::equal(w.micro_batch(0, 1), torch::arange(16, 20, torch::kLong)));
  EXPECT_TRUE(torch::equal(w.micro_batch(3, 1), torch::tensor({28, 29}, torch::kLong)));
  EXPECT_EQ(w.samples_of_rank(0), 16);
  EXPECT_EQ(w.samples_of_rank(1), 14);
  EXPECT_EQ(w.slot(3, 1), 7);
  // Five samples: rank 0 has both chunks, rank 1 none; the window still has two micro-steps.
  const gradaccum::core::Window small(0, 0, torch::arange(5, torch::kLong), geometry,
                                      gradaccum::core::ChunkOrder::contiguous);
  EXPECT_EQ(small.micro_steps(), 2);
  EXPECT_EQ(small.micro_batch(1, 0).size(0), 1);
  EXPECT_EQ(small.micro_batch(0, 1).size(0), 0);
}

// Float32, b = 4, B = 32, 20 steps, one thread per process (libtorch's CPU reductions are
// deterministic for a given thread count).
const std::string kRun =
    "train --set model.type=cnn --set model.channels=[4,8] --set model.hidden=[16] --set data.train_limit=2048 "
    "--set data.eval_limit=0 --set max_steps=20 --set threads=1 --set per_device_train_batch_size=4 "
    "--set global_batch_size=32 --set grad_flow_steps=0 --set dtype=float32";

// Each optimizer step's "loss" and "grad_norm" as metrics.jsonl prints them (shortest round-trip
// decimal: equal text is equal bits).
std::vector<std::string> trajectory(const std::string& dir) {
  std::vector<std::string> lines;
  for (const auto& j : read_jsonl(dir + "/metrics.jsonl")) {
    if (j.contains("loss")) lines.push_back(j["loss"].dump() + " " + j["grad_norm"].dump());
  }
  return lines;
}

TEST(DeterministicAccumulation, SplitsAcrossRanksAreBitIdenticalInFloat32) {
  const auto dir = make_temp_dir("deterministic");
  const std::string on = kRun + " --set deterministic_accumulation=true";
  for (const auto& [name, launch] :
       std::vector<std::pair<std::string, std::string>>{{"w1", ""}, {"w2", " --nproc 2"}, {"w4", " --nproc 4"}}) {
    const auto r = run_cli(on + launch + " --set output_dir=" + dir + "/" + name);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  const auto reference = trajectory(dir + "/w1");
  ASSERT_EQ(reference.size(), 20u);
  EXPECT_EQ(trajectory(dir + "/w2"), reference);
  EXPECT_EQ(trajectory(dir + "/w4"), reference);
  const auto weights = read_text(dir + "/w1/final/model.safetensors");
  EXPECT_EQ(read_text(dir + "/w2/final/model.safetensors"), weights);
  EXPECT_EQ(read_text(dir + "/w4/final/model.safetensors"), weights);
  // N x W as run: 8 micro-steps on one rank, 2 on each of four.
  EXPECT_EQ(read_jsonl(dir + "/w4/metrics.jsonl").front()["micro_steps"].get<int64_t>(), 2);

  // Without the option the same runs drift apart in the last bits.
  for (const auto& [name, launch] :
       std::vector<std::pair<std::string, std::string>>{{"plain1", ""}, {"plain2", " --nproc 2"}}) {
    const auto r = run_cli(kRun + launch + " --set output_dir=" + dir + "/" + name);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  EXPECT_NE(trajectory(dir + "/plain1"), trajectory(dir + "/plain2"));
  EXPECT_NE(read_text(dir + "/plain1/final/model.safetensors"), read_text(dir + "/plain2/final/model.safetensors"));
}

TEST(DeterministicAccumulation, AResumeOntoAnotherDecompositionStaysBitIdentical) {
  const auto dir = make_temp_dir("deterministic-resume");
  const std::string on = kRun + " --set deterministic_accumulation=true";
  const auto whole = run_cli(on + " --set save_steps=10 --set output_dir=" + dir + "/whole");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  // The (8, 1) run's step-10 checkpoint, continued as (4, 2).
  const auto resumed = run_cli(on + " --nproc 2 --set output_dir=" + dir +
                               "/resumed --set resume_from_checkpoint=" + dir + "/whole/checkpoints/step-10");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto reference = trajectory(dir + "/whole");
  const auto continued = trajectory(dir + "/resumed");
  ASSERT_EQ(continued.size(), 10u);  // steps 11 to 20
  EXPECT_EQ(continued, std::vector<std::string>(reference.begin() + 10, reference.end()));
  EXPECT_EQ(read_text(dir + "/resumed/final/model.safetensors"), read_text(dir + "/whole/final/model.safetensors"));
}

TEST(DeterministicAccumulation, RefusesWhatItCannotKeepBitIdentical) {
  // Three ranks of b = 4, N = 2 (a global batch of 24).
  const auto three = run_cli(kRun +
                             " --set deterministic_accumulation=true --set global_batch_size=0 "
                             "--set gradient_accumulation_steps=2 --nproc 3 --set output_dir=" +
                             make_temp_dir("deterministic-w") + "/out");
  EXPECT_EQ(three.exit_code, 1);
  EXPECT_EQ(three.err,
            "gradaccum: error: key 'deterministic_accumulation': the world size must be a power of two, not 3\n");
  const auto naive = run_cli(kRun + " --set deterministic_accumulation=true --set loss_normalization=micro_batch");
  EXPECT_EQ(naive.exit_code, 1);
  EXPECT_EQ(naive.err,
            "gradaccum: error: key 'deterministic_accumulation': needs loss_normalization window or sum, not "
            "micro_batch\n");
  const auto zero = run_cli(kRun + " --set deterministic_accumulation=true --set zero_stage=1");
  EXPECT_EQ(zero.exit_code, 1);
  EXPECT_NE(zero.err.find("cannot be combined with sync_each_micro_step or zero_stage: 1"), std::string::npos)
      << zero.err;
}

}  // namespace deterministic_accumulation_test
