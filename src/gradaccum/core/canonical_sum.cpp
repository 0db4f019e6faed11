#include "gradaccum/core/canonical_sum.h"

#include "gradaccum/base/check.h"

namespace gradaccum::core {

int64_t odd_part(int64_t n) {
  GA_CHECK(n >= 1, "odd_part: {} is not positive", n);
  while (n % 2 == 0) n /= 2;
  return n;
}

namespace {

// The canonical tree over values[begin, end): halves while the length is even, then left to right.
std::optional<double> tree(const std::vector<double>& values, const std::vector<bool>& present, size_t begin,
                           size_t end) {
  const size_t length = end - begin;
  if (length % 2 == 0) {
    const size_t middle = begin + length / 2;
    const auto left = tree(values, present, begin, middle);
    const auto right = tree(values, present, middle, end);
    if (left && right) return *left + *right;
    return left ? left : right;
  }
  std::optional<double> sum;
  for (size_t i = begin; i < end; ++i) {
    if (!present[i]) continue;
    sum = sum ? *sum + values[i] : values[i];
  }
  return sum;
}

}  // namespace

std::optional<double> canonical_sum(const std::vector<double>& values, const std::vector<bool>& present) {
  GA_CHECK(values.size() == present.size() && !values.empty(), "canonical_sum: {} values, {} flags", values.size(),
           present.size());
  return tree(values, present, 0, values.size());
}

torch::Tensor canonical_sum(const torch::Tensor& slots) {
  GA_CHECK(slots.dim() == 1 && slots.numel() >= 1, "canonical_sum: expected a non-empty vector");
  const int64_t n = slots.numel(), o = odd_part(n);
  const auto blocks = slots.view({n / o, o});
  auto level = blocks.select(1, 0).clone();
  for (int64_t i = 1; i < o; ++i) level = level + blocks.select(1, i);  // each block left to right
  while (level.numel() > 1) {
    const auto pairs = level.view({level.numel() / 2, 2});
    level = pairs.select(1, 0) + pairs.select(1, 1);  // neighbours, as the binary tree pairs them
  }
  return level.squeeze(0);
}

torch::Tensor slot_vector(const std::vector<torch::Tensor>& values, int64_t first, int64_t slots,
                          torch::Device device) {
  const auto options = torch::TensorOptions(torch::kDouble).device(device);
  GA_CHECK(first >= 0 && first + static_cast<int64_t>(values.size()) <= slots,
           "slot_vector: {} values from slot {} exceed {} slots", values.size(), first, slots);
  std::vector<torch::Tensor> parts;
  for (const auto& v : values) {
    parts.push_back(v.defined() ? v.reshape({1}).to(options) : torch::zeros({1}, options));
  }
  auto vector = torch::zeros({slots}, options);
  if (!parts.empty()) vector.narrow(0, first, static_cast<int64_t>(parts.size())).copy_(torch::cat(parts));
  return vector;
}

CanonicalGradientSum::CanonicalGradientSum(int64_t slots) : slots_(slots), block_length_(odd_part(slots)) {}

void CanonicalGradientSum::add_into(Node& left, Node right) {
  for (size_t i = 0; i < left.size(); ++i) {
    if (!right[i].defined()) continue;
    if (!left[i].defined()) {
      left[i] = std::move(right[i]);
    } else {
      left[i].add_(right[i]);
    }
  }
}

void CanonicalGradientSum::add(std::vector<torch::Tensor> gradients) {
  GA_CHECK(seen_ < slots_, "CanonicalGradientSum: more than {} slots", slots_);
  if (!block_) {
    block_ = std::move(gradients);
  } else {
    GA_CHECK(block_->size() == gradients.size(), "CanonicalGradientSum: {} gradients, then {}", block_->size(),
             gradients.size());
    add_into(*block_, std::move(gradients));
  }
  close_slot();
}

void CanonicalGradientSum::skip() {
  GA_CHECK(seen_ < slots_, "CanonicalGradientSum: more than {} slots", slots_);
  close_slot();
}

void CanonicalGradientSum::close_slot() {
  ++seen_;
  if (seen_ % block_length_ != 0) return;
  // A block is complete: it enters the binary counter at level 0; equal levels merge, the earlier
  // (left) subtree first.
  Node node = block_ ? std::move(*block_) : Node{};
  block_.reset();
  int level = 0;
  while (!stack_.empty() && stack_.back().second == level) {
    Node left = std::move(stack_.back().first);
    stack_.pop_back();
    if (left.empty()) {
      left = std::move(node);
    } else if (!node.empty()) {
      add_into(left, std::move(node));
    }
    node = std::move(left);
    ++level;
  }
  stack_.emplace_back(std::move(node), level);
}

std::vector<torch::Tensor> CanonicalGradientSum::finish() {
  GA_CHECK(seen_ == slots_, "CanonicalGradientSum: {} of {} slots seen", seen_, slots_);
  GA_CHECK(stack_.size() == 1, "CanonicalGradientSum: {} subtrees left", stack_.size());
  auto root = std::move(stack_.back().first);
  stack_.clear();
  seen_ = 0;
  return root;
}

}  // namespace gradaccum::core
