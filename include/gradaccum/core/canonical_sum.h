// The order in which `deterministic_accumulation` adds a window's micro-batch gradients, so that
// for a fixed micro-batch size b the float32 sum is bit-identical for every split of the window's
// M = N × W micro-batches into N micro-steps on each of W ranks (W a power of two).
//
// The canonical tree over the window's micro-batch slots 0..M-1 (slot = rank × N + micro-step,
// WindowPlan's contiguous chunk order): write M = 2^a × o with o odd; consecutive blocks of o
// slots are summed left to right, and the 2^a block sums are added pairwise, as a balanced
// binary tree. A rank's N = M / W slots are then a subtree (W is a power of two, so N has the
// same odd part o), and the ranks' subtree roots meet in the tree's top log2(W) levels, which the
// cross-rank reduction (dist/tree_grad_sync.h) pairs the same way (rank r with r xor 2^k). IEEE
// addition is commutative, so a pair's two ranks compute the same bits.
//
// A slot can be absent (a partial window's empty micro-batches, a parameter that got no
// gradient): absent + x = x, so absences never add a +0 that could turn a -0 into +0.
//
// Streaming: slots arrive in order and at most log2(N) + 1 partial sums are held (the block in
// progress and a binary counter of finished subtrees), each a full copy of the gradients.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace gradaccum::core {

// The odd part o of n >= 1 (n = 2^a × o).
int64_t odd_part(int64_t n);

// The canonical tree's sum of `values` (absent where `present` is false), in float64.
// nullopt when every value is absent.
std::optional<double> canonical_sum(const std::vector<double>& values, const std::vector<bool>& present);

// The same tree on the device, for a 1-D float64 tensor of slots where absent slots hold +0
// (equal to the absent-aware sum whenever no present value is -0, as for loss sums and counts).
// Elementwise additions only: no reduction kernel, whose order could change, and no host read.
torch::Tensor canonical_sum(const torch::Tensor& slots);

// A 1-D float64 tensor of `slots` zeros holding `values` (0-dim; undefined: absent, 0) at
// [first, first + values.size()).
torch::Tensor slot_vector(const std::vector<torch::Tensor>& values, int64_t first, int64_t slots, torch::Device device);

class CanonicalGradientSum {
 public:
  // A rank's `slots` (its N micro-steps) of one window.
  explicit CanonicalGradientSum(int64_t slots);

  // The next slot's gradients, one per parameter; an undefined tensor is an absent gradient.
  void add(std::vector<torch::Tensor> gradients);
  // The next slot is absent (no samples on this rank at this micro-step).
  void skip();
  // After all `slots` slots: the rank's subtree root, one tensor per parameter (undefined where
  // every slot lacked it); empty when every slot was skipped.
  std::vector<torch::Tensor> finish();

  // Partial sums held now (for the memory figures of the documentation and the tests).
  size_t held() const { return stack_.size() + (block_.has_value() ? 1 : 0); }

 private:
  using Node = std::vector<torch::Tensor>;
  static void add_into(Node& left, Node right);  // left := left + right, per tensor, absent-aware
  void close_slot();

  int64_t slots_, block_length_, seen_ = 0;
  std::optional<Node> block_;                // the block of o slots in progress
  std::vector<std::pair<Node, int>> stack_;  // finished subtrees and their levels
};

}  // namespace gradaccum::core
