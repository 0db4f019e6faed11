// ZeRO stage 1: optimizer state sharded across data-parallel ranks (and, with a ShardedGradSync
// as the gradients' source, the optimizer step of ZeRO stage 2).
//
// After the gradient all-reduce every rank holds the full gradient. The
// flattened parameter space is cut into W equal contiguous ranges; rank r keeps
// optimizer state (AdamW's two moments, SGD's momentum) only for range r, steps
// those elements in place, and one all-gather gives every rank the updated
// parameters. Optimizers here are element-wise, so the arithmetic is the
// unsharded optimizer's: the weights equal plain data parallel's, while the
// state memory per rank drops to 1/W.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

#include "gradaccum/dist/sharded_grad_sync.h"
#include "gradaccum/optim/optimizer_factory.h"
#include "gradaccum/optim/optimizer_state.h"

namespace gradaccum::dist {

// An optimizer that steps, and holds the state of, this rank's pieces of the parameters only
// (ZeRO-1 and 2 here; ZeRO-3's UnitShardOptimizer): each rank saves and loads its own.
class ShardOwningOptimizer : public torch::optim::Optimizer {
 public:
  using torch::optim::Optimizer::Optimizer;
  // The optimizer that steps this rank's pieces (nullptr when it owns none).
  virtual torch::optim::Optimizer* shard_optimizer() const = 0;
  // shard_optimizer()'s parameters under the names "<param>[begin:end]" (elements of the
  // flattened parameter), given the parameters this optimizer was built with, named.
  virtual optim::NamedParameters named_shards(const optim::NamedParameters& params) const = 0;
  // Elements of optimizer state this rank holds (AdamW: both moments, SGD: the momentum buffer).
  int64_t state_elements() const;

 protected:
  // The base class only needs defaults for its bookkeeping of param groups.
  static std::unique_ptr<torch::optim::OptimizerOptions> defaults_for(const optim::OptimizerSpec& spec);
};

class ShardedOptimizer final : public ShardOwningOptimizer {
 public:
  // `params` in the same order on every rank, all of one dtype and device.
  // `gather_bytes`: output bytes of one all-gather call (all ranks' pieces);
  // small, so the step's transient buffers are too (see step()).
  ShardedOptimizer(c10::intrusive_ptr<c10d::Backend> group, std::vector<torch::Tensor> params,
                   const optim::OptimizerSpec& spec, int64_t gather_bytes = kDefaultGatherBytes);

  static constexpr int64_t kDefaultGatherBytes = int64_t{4} << 20;

  // Steps this rank's range with the learning rate set on this optimizer's
  // param group, then all-gathers the ranges.
  torch::Tensor step(LossClosure closure = nullptr) override;

  // ZeRO-2: step() reads this rank's range of the gradient from `sync` (which must outlive this
  // optimizer and cut the same ranges) instead of the parameters' .grad.
  void take_gradients_from(const ShardedGradSync& sync);

  // Parameter elements this rank steps: its range of the flattened parameters.
  int64_t owned_elements() const { return end_ - begin_; }
  // state_elements() is a multiple of owned_elements() once stepped, never of the whole model:
  // the number ZeRO-1's memory saving comes from.

  // Steps this rank's range (nullptr when the range is empty).
  torch::optim::Optimizer* shard_optimizer() const override { return local_.get(); }
  optim::NamedParameters named_shards(const optim::NamedParameters& params) const override;

 private:
  // A piece of one parameter inside this rank's range.
  struct Piece {
    size_t param;
    int64_t begin, end;   // within the parameter, flattened
    torch::Tensor shard;  // a view of those elements: the local optimizer updates them in place
  };

  c10::intrusive_ptr<c10d::Backend> group_;
  std::vector<torch::Tensor> all_;
  int64_t gather_bytes_;
  int64_t shard_size_ = 0;  // elements per rank (the last range is padded)
  int64_t begin_ = 0, end_ = 0;
  std::vector<Piece> pieces_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  const ShardedGradSync* gradient_source_ = nullptr;
};

// optim::optimizer_state of the optimizer a trainer holds over `params`: a ShardedOptimizer's
// shard under named_shards(), any other optimizer under the parameters' names.
optim::NamedStateTensors named_optimizer_state(const torch::optim::Optimizer& optimizer,
                                               const optim::NamedParameters& params);
// optim::load_optimizer_state into either kind, named as named_optimizer_state() names it.
void load_named_optimizer_state(torch::optim::Optimizer& optimizer, const optim::NamedParameters& params,
                                const optim::NamedStateTensors& state, const std::string& what);

}  // namespace gradaccum::dist
