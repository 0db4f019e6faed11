// ZeRO stage 1: optimizer state sharded across data-parallel ranks.
//
// After the gradient all-reduce every rank holds the full gradient, but each
// parameter's optimizer state (AdamW's two moments, SGD's momentum) lives on
// one owner rank only. Each rank steps the parameters it owns, then every
// owner broadcasts its updated parameters (one broadcast per rank). The
// arithmetic is the unsharded optimizer's, so the weights equal plain data
// parallel's; the state memory per rank drops to about 1/W.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "gradaccum/optim/optimizer_factory.h"

namespace gradaccum::dist {

class ShardedOptimizer final : public torch::optim::Optimizer {
 public:
  // `params` in the same order on every rank. Ownership is a deterministic
  // greedy balance of parameter sizes, so every rank computes the same map.
  ShardedOptimizer(c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<torch::Tensor> params,
                   const optim::OptimizerSpec& spec);

  // Steps the owned parameters with the learning rate set on this optimizer's
  // param group, then broadcasts every owner's parameters.
  torch::Tensor step(LossClosure closure = nullptr) override;

  int64_t owned_parameters() const;  // elements this rank keeps state for
  int64_t owner_of(size_t param) const { return owner_[param]; }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<torch::Tensor> all_;
  std::vector<int64_t> owner_;
  std::unique_ptr<torch::optim::Optimizer> local_;  // over the owned parameters only
};

}  // namespace gradaccum::dist
