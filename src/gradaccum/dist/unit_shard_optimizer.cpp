#include "gradaccum/dist/unit_shard_optimizer.h"

#include <algorithm>

#include "gradaccum/base/check.h"

namespace gradaccum::dist {

UnitShardOptimizer::UnitShardOptimizer(ShardedParameters& sharded, const optim::OptimizerSpec& spec)
    : ShardOwningOptimizer({torch::optim::OptimizerParamGroup(sharded.parameters())}, defaults_for(spec)),
      sharded_(sharded) {
  const auto& params = sharded_.parameters();
  const auto& units = sharded_.flat_units();
  const int64_t rank = sharded_.rank();
  std::vector<torch::Tensor> shards;
  std::vector<bool> decayed;
  for (size_t u = 0; u < units.size(); ++u) {
    const auto& unit = units[u];
    const int64_t lo = rank * unit.shard_size, hi = lo + unit.shard_size;
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const int64_t a = std::max(lo, unit.offsets[i]), b = std::min(hi, unit.offsets[i + 1]);
      if (a >= b) continue;
      auto view = unit.shard.slice(0, a - lo, b - lo);
      pieces_.push_back({u, unit.params[i], a - unit.offsets[i], b - unit.offsets[i], a - lo, view});
      shards.push_back(view);
      decayed.push_back(optim::takes_weight_decay(params[unit.params[i]]));
    }
  }
  if (!shards.empty()) local_ = optim::make_optimizer(spec, shards, decayed);
}

torch::Tensor UnitShardOptimizer::step(LossClosure closure) {
  GA_CHECK(!closure, "the sharded optimizer takes no closure");
  torch::NoGradGuard no_grad;
  if (local_) {
    const auto& units = sharded_.flat_units();
    for (auto& piece : pieces_) {
      const auto& g = units[piece.unit].grad_shard;
      GA_CHECK(g.defined(), "zero_stage: 3: the optimizer steps outside a window's end");
      piece.shard.mutable_grad() = g.slice(0, piece.at, piece.at + piece.end - piece.begin);
    }
    optim::set_learning_rate(*local_, param_groups()[0].options().get_lr());
    local_->step();
    for (auto& piece : pieces_) piece.shard.mutable_grad() = torch::Tensor();
  }
  sharded_.after_optimizer_step();
  return {};
}

optim::NamedParameters UnitShardOptimizer::named_shards(const optim::NamedParameters& params) const {
  GA_CHECK(params.size() == sharded_.parameters().size(), "the sharded optimizer has {} parameters, not {}",
           sharded_.parameters().size(), params.size());
  optim::NamedParameters shards;
  for (const auto& piece : pieces_) {
    shards.emplace_back(fmt::format("{}[{}:{}]", params[piece.param].first, piece.begin, piece.end), piece.shard);
  }
  return shards;
}

int64_t UnitShardOptimizer::owned_elements() const {
  int64_t n = 0;
  for (const auto& piece : pieces_) n += piece.end - piece.begin;
  return n;
}

}  // namespace gradaccum::dist
