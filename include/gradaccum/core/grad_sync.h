// Gradient synchronization across data-parallel ranks, as the engine sees it.
//
// The contract that makes accumulation cheap: an implementation communicates
// only on a window's last micro-step. On the others, gradients just accumulate
// locally in the parameters' .grad (no all-reduce per micro-step).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "gradaccum/optim/grad_clip.h"

namespace gradaccum::core {

class GradSync {
 public:
  virtual ~GradSync() = default;
  virtual int64_t world_size() const = 0;
  virtual int64_t rank() const = 0;
  // Called before each micro-step's backward. `last` is true only on the
  // window's last micro-step: the one place communication may start.
  virtual void before_backward(bool last) = 0;
  // Called after each micro-step's backward (also when this rank had no
  // samples in it and ran none).
  virtual void after_backward(bool last) {}
  // Called before after_backward when this rank's micro-step failed part-way and a piece took the
  // error (out of memory): its forward or backward stopped after some of the collectives its
  // peers run in every micro-step. after_backward then runs the rest, in the peers' order.
  virtual void abandon_micro_step() {}
  // After the last backward: completes gradient communication (each gradient
  // becomes the sum over ranks) and sums `totals` (a small 1-D float64 tensor of
  // window loss sums and counts) over ranks in place.
  virtual void finish_window(torch::Tensor& totals) = 0;
  // Gradient all-reduce calls and bytes of the window finished last (reduce-scatters where
  // sharded_policy() is not empty).
  virtual int64_t allreduce_calls() const { return 0; }
  virtual int64_t allreduce_bytes() const { return 0; }
  // Parameter all-gathers of the window finished last (ZeRO-3: a unit's, for its forward and for
  // its backward); 0 where parameters are whole.
  virtual int64_t all_gather_calls() const { return 0; }

  // The window's summed gradient as this rank holds it after finish_window, which the
  // normalization, clipping and the optimizer step act on: every parameter's .grad (undefined
  // where a parameter has none), unless an implementation keeps only a shard of it (ZeRO-2).
  virtual std::vector<torch::Tensor> gradients(const std::vector<torch::Tensor>& params) const {
    std::vector<torch::Tensor> grads;
    grads.reserve(params.size());
    for (const auto& p : params) grads.push_back(p.grad());
    return grads;
  }
  // ‖g‖₂ of the window's whole gradient from this rank's gradients(): their own norm when every
  // rank holds all of it; a sharded implementation sums the squared shard norms over ranks.
  virtual torch::Tensor global_norm(const std::vector<torch::Tensor>& gradients) {
    return optim::tensors_norm(gradients);
  }
  // ‖w‖₂ of all the trainable parameters after a step. An implementation that holds only a shard
  // of them (ZeRO-3) sums the squared shard norms over ranks.
  virtual torch::Tensor weight_norm(const std::vector<torch::Tensor>& params) {
    return optim::global_weight_norm(params);
  }
  // Runs `fn` with every parameter whole on this rank, outside the forward (evaluation,
  // checkpoints); what fn writes into them is kept. Every rank calls it at the same point: an
  // implementation that keeps parameters sharded (ZeRO-3) gathers them before and drops them after.
  virtual void with_whole_parameters(const std::function<void()>& fn) { fn(); }
  // Whether a window stopped between micro-steps can be saved from the parameters' .grad.
  virtual bool can_stop_inside_window() const { return true; }
  // A sharded implementation's policy for the window finished last, for the step's record
  // ("defer" | "each_micro_step"); empty otherwise.
  virtual std::string sharded_policy() const { return {}; }
};

// One process: nothing to communicate.
class LocalGradSync final : public GradSync {
 public:
  int64_t world_size() const override { return 1; }
  int64_t rank() const override { return 0; }
  void before_backward(bool) override {}
  void finish_window(torch::Tensor&) override {}
};

}  // namespace gradaccum::core
