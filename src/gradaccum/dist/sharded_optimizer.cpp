#include "gradaccum/dist/sharded_optimizer.h"

#include <algorithm>

#include "gradaccum/base/check.h"

namespace gradaccum::dist {

std::unique_ptr<torch::optim::OptimizerOptions> ShardOwningOptimizer::defaults_for(const optim::OptimizerSpec& spec) {
  if (spec.type == optim::OptimizerType::sgd) return std::make_unique<torch::optim::SGDOptions>(spec.learning_rate);
  return std::make_unique<torch::optim::AdamWOptions>(spec.learning_rate);
}

ShardedOptimizer::ShardedOptimizer(c10::intrusive_ptr<c10d::Backend> group, std::vector<torch::Tensor> params,
                                   const optim::OptimizerSpec& spec, int64_t gather_bytes)
    : ShardOwningOptimizer({torch::optim::OptimizerParamGroup(params)}, defaults_for(spec)),
      group_(std::move(group)),
      all_(std::move(params)),
      gather_bytes_(gather_bytes) {
  GA_CHECK(gather_bytes_ > 0, "the sharded optimizer's all-gather chunk must be > 0 bytes, not {}", gather_bytes_);
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
  std::vector<bool> decayed;  // flat shards: the weight-decay rule asks their parameters
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
      decayed.push_back(optim::takes_weight_decay(all_[k]));
    }
    offset += n;
  }
  if (!shards.empty()) local_ = optim::make_optimizer(spec, shards, decayed);
}

torch::Tensor ShardedOptimizer::step(LossClosure closure) {
  GA_CHECK(!closure, "the sharded optimizer takes no closure");
  torch::NoGradGuard no_grad;
  if (local_) {
    const auto flat_shard = gradient_source_ != nullptr ? gradient_source_->gradient_shard() : torch::Tensor();
    int64_t at = 0;  // where the piece starts within the range
    for (auto& piece : pieces_) {
      const int64_t n = piece.end - piece.begin;
      if (flat_shard.defined()) {
        piece.shard.mutable_grad() = flat_shard.slice(0, at, at + n);
      } else {
        const auto& grad = all_[piece.param].grad();
        piece.shard.mutable_grad() =
            grad.defined() ? grad.view({-1}).slice(0, piece.begin, piece.end) : torch::Tensor();
      }
      at += n;
    }
    optim::set_learning_rate(*local_, param_groups()[0].options().get_lr());
    local_->step();
    // The views share the parameters' gradient storage: held past the step,
    // they would keep this rank's gradients alive after zero_grad releases
    // them, i.e. twice during the next backward (~half the model's size).
    for (auto& piece : pieces_) piece.shard.mutable_grad() = torch::Tensor();
  }
  // Every rank contributes its (updated) range; all receive all ranges. In
  // chunks of ~4 MB of output, packed from the pieces chunk by chunk into
  // buffers reused across chunks: no range-sized copy, and transients (ours
  // and Gloo's flat copy) small enough to fit in the holes the freed
  // gradients leave in the heap. With 25 MB chunks and a range-sized
  // staging copy, freed-but-resident heap ate ~150 MB of the 310 MiB that
  // sharding saves on an 81M-parameter model (BENCHMARKS.md, ZeRO-1).
  const auto options = all_.front().options();
  const int64_t world = group_->getSize();
  const int64_t chunk = std::min(
      shard_size_, std::max<int64_t>(1, gather_bytes_ / (world * static_cast<int64_t>(all_.front().element_size()))));
  auto mine = torch::empty({chunk}, options);
  std::vector<torch::Tensor> received;
  for (int64_t r = 0; r < world; ++r) received.push_back(torch::empty({chunk}, options));
  for (int64_t c0 = 0; c0 < shard_size_; c0 += chunk) {
    const int64_t c1 = std::min(shard_size_, c0 + chunk);
    // Elements [c0, c1) of this rank's range; the last range's padding is zero.
    std::vector<torch::Tensor> input{mine.slice(0, 0, c1 - c0)};
    input[0].zero_();
    int64_t at = 0;  // where the piece starts within the range
    for (auto& piece : pieces_) {
      const int64_t n = piece.shard.numel();
      const int64_t a = std::max(c0, at), b = std::min(c1, at + n);
      if (a < b) input[0].slice(0, a - c0, b - c0).copy_(piece.shard.slice(0, a - at, b - at));
      at += n;
      if (at >= c1) break;
    }
    std::vector<std::vector<torch::Tensor>> output(1);
    for (int64_t r = 0; r < world; ++r) output[0].push_back(received[r].slice(0, 0, c1 - c0));
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

void ShardedOptimizer::take_gradients_from(const ShardedGradSync& sync) {
  GA_CHECK(sync.begin() == begin_ && sync.end() == end_ && sync.shard_size() == shard_size_,
           "zero_stage: 2: the gradient shard [{}, {}) is not the optimizer's range [{}, {})", sync.begin(), sync.end(),
           begin_, end_);
  gradient_source_ = &sync;
}

int64_t ShardOwningOptimizer::state_elements() const {
  const auto* local = shard_optimizer();
  if (local == nullptr) return 0;
  int64_t n = 0;
  auto add = [&n](const torch::Tensor& t) { n += t.defined() ? t.numel() : 0; };
  for (const auto& entry : local->state()) {
    if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(entry.second.get())) {
      add(adamw->exp_avg());
      add(adamw->exp_avg_sq());
      add(adamw->max_exp_avg_sq());
    } else if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(entry.second.get())) {
      add(sgd->momentum_buffer());
    }
  }
  return n;
}

optim::NamedParameters ShardedOptimizer::named_shards(const optim::NamedParameters& params) const {
  GA_CHECK(params.size() == all_.size(), "the sharded optimizer has {} parameters, not {}", all_.size(), params.size());
  optim::NamedParameters shards;
  for (const auto& piece : pieces_) {
    shards.emplace_back(fmt::format("{}[{}:{}]", params[piece.param].first, piece.begin, piece.end), piece.shard);
  }
  return shards;
}

optim::NamedStateTensors named_optimizer_state(const torch::optim::Optimizer& optimizer,
                                               const optim::NamedParameters& params) {
  if (const auto* sharded = dynamic_cast<const ShardOwningOptimizer*>(&optimizer)) {
    if (sharded->shard_optimizer() == nullptr) return {};
    return optim::optimizer_state(*sharded->shard_optimizer(), sharded->named_shards(params));
  }
  return optim::optimizer_state(optimizer, params);
}

void load_named_optimizer_state(torch::optim::Optimizer& optimizer, const optim::NamedParameters& params,
                                const optim::NamedStateTensors& state, const std::string& what) {
  if (auto* sharded = dynamic_cast<ShardOwningOptimizer*>(&optimizer)) {
    if (sharded->shard_optimizer() == nullptr) {
      GA_CHECK(state.empty(), "{}: optimizer state for a rank that owns no parameters", what);
      return;
    }
    optim::load_optimizer_state(*sharded->shard_optimizer(), sharded->named_shards(params), state, what);
    return;
  }
  optim::load_optimizer_state(optimizer, params, state, what);
}

}  // namespace gradaccum::dist
