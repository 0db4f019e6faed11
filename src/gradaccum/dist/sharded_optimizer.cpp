#include "gradaccum/dist/sharded_optimizer.h"

#include <algorithm>

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
  int64_t total = 0;
  for (const auto& p : all_) {
    GA_CHECK(p.scalar_type() == all_.front().scalar_type() && p.device() == all_.front().device(),
             "zero_stage: 1 needs all parameters in one dtype and on one device");
    total += p.numel();
  }
  const int64_t world = group_->getSize();
  shard_size_ = (total + world - 1) / world;
  begin_ = std::min(total, shard_size_ * group_->getRank());
  end_ = std::min(total, begin_ + shard_size_);

  std::vector<torch::Tensor> shards;
  int64_t offset = 0;
  for (size_t k = 0; k < all_.size(); ++k) {
    const int64_t n = all_[k].numel();
    const int64_t a = std::max(begin_, offset), b = std::min(end_, offset + n);
    if (a < b) {
      // detach(): a view of the parameter's storage outside autograd, so the
      // local optimizer's in-place update lands in the parameter itself.
      auto shard = all_[k].detach().view({-1}).slice(0, a - offset, b - offset);
      pieces_.push_back({k, a - offset, b - offset, shard});
      shards.push_back(shard);
    }
    offset += n;
  }
  if (!shards.empty()) local_ = optim::make_optimizer(spec, shards);
}

torch::Tensor ShardedOptimizer::step(LossClosure closure) {
  GA_CHECK(!closure, "the sharded optimizer takes no closure");
  torch::NoGradGuard no_grad;
  if (local_) {
    for (auto& piece : pieces_) {
      const auto& grad = all_[piece.param].grad();
      piece.shard.mutable_grad() =
          grad.defined() ? grad.view({-1}).slice(0, piece.begin, piece.end) : torch::Tensor();
    }
    optim::set_learning_rate(*local_, param_groups()[0].options().get_lr());
    local_->step();
  }
  // Every rank contributes its (updated) range; all receive all ranges. In
  // chunks of ~25 MB of output, so the transient buffers (ours and Gloo's
  // flat copy) stay small next to the optimizer state this saves.
  const auto options = all_.front().options();
  const int64_t world = group_->getSize();
  const int64_t chunk = std::max<int64_t>(
      1024, (int64_t{25} << 20) / (world * static_cast<int64_t>(all_.front().element_size())));
  auto mine = torch::zeros({shard_size_}, options);
  int64_t at = 0;
  for (auto& piece : pieces_) {
    mine.slice(0, at, at + piece.shard.numel()).copy_(piece.shard);
    at += piece.shard.numel();
  }
  for (int64_t c0 = 0; c0 < shard_size_; c0 += chunk) {
    const int64_t c1 = std::min(shard_size_, c0 + chunk);
    std::vector<torch::Tensor> input{mine.slice(0, c0, c1)};
    std::vector<std::vector<torch::Tensor>> output(1);
    for (int64_t r = 0; r < world; ++r) output[0].push_back(torch::empty({c1 - c0}, options));
    group_->allgather(output, input)->wait();
    // Scatter rank r's elements [c0, c1) of its range back into the parameters.
    for (int64_t r = 0; r < world; ++r) {
      if (r == group_->getRank()) continue;
      const int64_t lo = r * shard_size_ + c0, hi = r * shard_size_ + c1;
      int64_t offset = 0;
      for (auto& p : all_) {
        const int64_t a = std::max(lo, offset), b = std::min(hi, offset + p.numel());
        if (a < b) {
          p.detach().view({-1}).slice(0, a - offset, b - offset).copy_(output[0][r].slice(0, a - lo, b - lo));
        }
        offset += p.numel();
        if (offset >= hi) break;
      }
    }
  }
  return {};
}

void ShardedOptimizer::save(torch::serialize::OutputArchive& archive) const {
  // An empty range (more ranks than elements) has no optimizer and no state.
  if (local_) local_->save(archive);
}

void ShardedOptimizer::load(torch::serialize::InputArchive& archive) {
  if (local_) local_->load(archive);
}

}  // namespace gradaccum::dist
