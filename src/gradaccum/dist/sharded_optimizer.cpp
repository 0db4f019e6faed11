#include "gradaccum/dist/sharded_optimizer.h"

#include <algorithm>
#include <numeric>

#include "gradaccum/core/check.h"

namespace gradaccum::dist {

namespace {
// The base class only needs defaults for its bookkeeping of param groups.
std::unique_ptr<torch::optim::OptimizerOptions> defaults_for(const optim::OptimizerSpec& spec) {
  if (spec.type == "sgd") return std::make_unique<torch::optim::SGDOptions>(spec.learning_rate);
  return std::make_unique<torch::optim::AdamWOptions>(spec.learning_rate);
}
}  // namespace

ShardedOptimizer::ShardedOptimizer(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                   std::vector<torch::Tensor> params, const optim::OptimizerSpec& spec)
    : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(params)}, defaults_for(spec)),
      group_(std::move(group)),
      all_(std::move(params)) {
  const int64_t world = group_->getSize();
  // Largest first, each to the least-loaded rank (ties: lowest rank).
  std::vector<size_t> order(all_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return all_[a].numel() > all_[b].numel(); });
  std::vector<int64_t> load(world, 0);
  owner_.assign(all_.size(), 0);
  for (auto k : order) {
    const auto rank = std::min_element(load.begin(), load.end()) - load.begin();
    owner_[k] = rank;
    load[rank] += all_[k].numel();
  }
  std::vector<torch::Tensor> mine;
  for (size_t k = 0; k < all_.size(); ++k) {
    if (owner_[k] == group_->getRank()) mine.push_back(all_[k]);
  }
  // A rank may own nothing when there are fewer parameters than ranks.
  if (!mine.empty()) local_ = optim::make_optimizer(spec, mine);
}

int64_t ShardedOptimizer::owned_parameters() const {
  int64_t n = 0;
  for (size_t k = 0; k < all_.size(); ++k) {
    if (owner_[k] == group_->getRank()) n += all_[k].numel();
  }
  return n;
}

torch::Tensor ShardedOptimizer::step(LossClosure closure) {
  GA_CHECK(!closure, "the sharded optimizer takes no closure");
  if (local_) {
    optim::set_learning_rate(*local_, param_groups()[0].options().get_lr());
    local_->step();
  }
  torch::NoGradGuard no_grad;
  for (int64_t root = 0; root < group_->getSize(); ++root) {
    std::vector<torch::Tensor> owned;
    for (size_t k = 0; k < all_.size(); ++k) {
      if (owner_[k] == root) owned.push_back(all_[k]);
    }
    if (owned.empty()) continue;
    std::vector<torch::Tensor> flat;
    for (auto& p : owned) flat.push_back(p.detach().reshape(-1));
    std::vector<torch::Tensor> buffer{torch::cat(flat)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    group_->broadcast(buffer, options)->wait();
    if (root == group_->getRank()) continue;
    int64_t offset = 0;
    for (auto& p : owned) {
      p.detach().copy_(buffer[0].slice(0, offset, offset + p.numel()).view_as(p));
      offset += p.numel();
    }
  }
  return {};
}

}  // namespace gradaccum::dist
