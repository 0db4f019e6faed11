// ZeRO stage 3's optimizer step: this rank's shards of every unit (sharded_parameters.h),
// stepped from their gradient shards.
//
// The pieces are the rank's range of each unit's flat buffer cut at parameter boundaries: views
// of the unit's shard (the parameters' master values between steps), each stepped with its
// parameter's weight-decay rule and named "<param>[begin:end]" in checkpoints, as ZeRO-1's are.
// Optimizers here are element-wise, so the arithmetic is the unsharded optimizer's. After the
// step only the root is gathered again: a unit's parameters are gathered where it computes next.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "gradaccum/dist/sharded_optimizer.h"
#include "gradaccum/dist/sharded_parameters.h"

namespace gradaccum::dist {

class UnitShardOptimizer final : public ShardOwningOptimizer {
 public:
  // `sharded` must outlive this optimizer.
  UnitShardOptimizer(ShardedParameters& sharded, const optim::OptimizerSpec& spec);

  // Steps the pieces with the learning rate set on this optimizer's param group.
  torch::Tensor step(LossClosure closure = nullptr) override;

  torch::optim::Optimizer* shard_optimizer() const override { return local_.get(); }
  optim::NamedParameters named_shards(const optim::NamedParameters& params) const override;
  // Parameter elements this rank steps.
  int64_t owned_elements() const;

 private:
  struct Piece {
    size_t unit;          // index into the flat units
    size_t param;         // index into the parameters
    int64_t begin, end;   // within the parameter, flattened
    int64_t at;           // where the piece starts within the unit's shard
    torch::Tensor shard;  // a view of the unit's shard: the local optimizer updates it in place
  };

  ShardedParameters& sharded_;
  std::vector<Piece> pieces_;
  std::unique_ptr<torch::optim::Optimizer> local_;
};

}  // namespace gradaccum::dist
