// ZeRO stage 3: each data-parallel rank keeps its shard of every unit's parameters, of their
// summed gradient and of their optimizer state; a unit's parameters are whole only while it
// computes.
//
// A unit (core/parameter_units.h: a decoder block, a top-level module) is one flat buffer of its
// parameters, padded to W equal ranges; the parameters are views into it, so autograd and the
// model see ordinary tensors. Outside the unit's computation the buffer's storage holds no memory
// (its views and autograd's saved references to them stay valid); rank r keeps range r in a
// shard of its own, which the optimizer (UnitShardOptimizer) steps. Around the unit:
// - forward: enter() all-gathers the ranges into the buffer, leave() releases it;
// - backward: the unit's first backward node gathers it again, and once the unit's backward has
//   run (the gradient reached its input) its gradient is reduced as the policy says and the
//   buffer released. A checkpointed unit recomputes inside that span: one gather serves both.
// Each gather starts the next unit's (the one after in the forward, the one before in the
// backward) without waiting for it: that all-gather runs on the backend's threads while the unit
// computes, and at most two units are whole at a time.
// The parameters in no unit (embeddings, heads, the final norm) are the root: one flat buffer
// that stays whole, whose gradient and optimizer state are sharded as in ZeRO-2 (its shard a view
// of its buffer, stepped in place), gathered after every optimizer step.
//
// The policy (grad_shard_policy.h) says, per unit, when its gradient is reduce-scattered into its
// shard: each_micro_step as soon as its backward has run, every micro-step (N collectives per
// unit per window, one micro-step's gradient of one unit held at a time); defer on the window's
// last micro-step only (one collective per unit per window, the unit's whole gradient held in the
// parameters' .grad between micro-steps). auto chooses per unit, by the memory available
// (choose_unit_grad_shard_policies).
//
// Every rank runs the same collectives in the same order: units are entered in index order in
// every forward and their backwards run in the reverse order. A rank with no samples in a
// micro-step (a partial window) replays the gathers and reductions its peers run, through the same
// functions, so that the collectives start in the same order; a rank whose micro-step failed
// part-way (out of memory in a unit's forward or backward) replays the rest of them, from where
// it stopped (each unit records what of its sequence this micro-step ran). Reductions are
// synchronous.
#pragma once

#include <torch/torch.h>

#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

#include "gradaccum/core/grad_sync.h"
#include "gradaccum/core/parameter_units.h"
#include "gradaccum/dist/grad_shard_policy.h"
#include "gradaccum/dist/sharded_grad_sync.h"

namespace gradaccum::dist {

class ShardedParameters final : public core::GradSync, public core::UnitScope {
 public:
  // One unit's flat buffer and this rank's shards of it.
  struct FlatUnit {
    std::vector<size_t> params;    // indexes into the parameters, in buffer order
    std::vector<int64_t> offsets;  // where each starts in the buffer, and the end
    int64_t shard_size = 0;        // elements per rank; the buffer holds W of them
    torch::Tensor buffer;          // the parameters' storage; no memory while released
    torch::Tensor shard;           // this rank's range: the root's a view of its buffer, a unit's its own
    torch::Tensor grads;           // a unit's: its parameters' .grad, laid out as the buffer, while attached
    bool grads_attached = false;
    torch::Tensor grad_shard;                         // the window's summed gradient of that range (undefined before)
    GradShardPolicy policy = GradShardPolicy::defer;  // each_micro_step or defer
    bool root = false;                                // never released
    bool gathered = false;                   // the buffer holds memory (and, once `pending` is done, the values)
    c10::intrusive_ptr<c10d::Work> pending;  // a prefetch in flight
    bool reduced = false;                    // in the current micro-step
    bool forward_gathered = false;           // gathered for the current micro-step's forward
    bool backward_gathered = false;          // gathered for its backward
  };

  // `params`: the trainable parameters in the same order on every rank, of one dtype and device;
  // `units`: the model's units (a parameter in none is the root's). Broadcasts rank 0's values,
  // keeps this rank's shards and releases every unit. Throws gradaccum::Error when no unit holds
  // a parameter.
  ShardedParameters(c10::intrusive_ptr<c10d::Backend> group, std::vector<torch::Tensor> params,
                    const core::ParameterUnits& units, ShardedGradSyncOptions options);
  // Without unshard() first (a run that failed), each released unit gets its memory back without
  // a collective: this rank's range from its shard, NaN elsewhere, so that nothing reads freed
  // memory and nothing takes the parameters for trained ones.
  ~ShardedParameters() override;
  ShardedParameters(const ShardedParameters&) = delete;
  ShardedParameters& operator=(const ShardedParameters&) = delete;

  // core::GradSync
  int64_t world_size() const override { return group_->getSize(); }
  int64_t rank() const override { return group_->getRank(); }
  void before_backward(bool last) override;
  void after_backward(bool last) override;
  void abandon_micro_step() override { abandoned_ = true; }
  void finish_window(torch::Tensor& totals) override;
  int64_t allreduce_calls() const override { return calls_; }  // reduce-scatters
  int64_t allreduce_bytes() const override { return bytes_; }
  std::vector<torch::Tensor> gradients(const std::vector<torch::Tensor>& params) const override;
  torch::Tensor global_norm(const std::vector<torch::Tensor>& gradients) override;
  torch::Tensor weight_norm(const std::vector<torch::Tensor>& params) override;
  void with_whole_parameters(const std::function<void()>& fn) override;
  // Every unit deferring: the partial sums are in .grad.
  bool can_stop_inside_window() const override;
  // The units' policy, or "defer <n> each_micro_step <m>" when auto chose both.
  std::string sharded_policy() const override;
  // What auto chose and why, one line (empty unless the policy was auto).
  const std::string& policy_reason() const { return policy_reason_; }

  // core::UnitScope
  torch::Tensor enter(int64_t unit, const torch::Tensor& input) override;
  torch::Tensor leave(int64_t unit, const torch::Tensor& output) override;

  // Every unit gathered for good: the parameters are ordinary whole tensors again, as before
  // sharding, and this object only reads them (for a model used after training).
  void unshard();

  // The root's buffer all-gathered from its shards (after the optimizer stepped them).
  void after_optimizer_step();

  const std::vector<FlatUnit>& flat_units() const { return units_; }
  const std::vector<torch::Tensor>& parameters() const { return params_; }

  // Reduce-scatters of the window in flight; all-gathers of the window finished last.
  int64_t window_reduce_scatters() const { return window_calls_; }
  int64_t all_gather_calls() const override { return gathers_; }
  // Bytes this rank holds now, counted from the tensors (each storage once): parameters
  // (gathered buffers and shards), gradients (.grad and gradient shards).
  int64_t held_parameter_bytes() const;
  int64_t held_gradient_bytes() const;

 private:
  friend struct UnitBoundaryNode;
  // Starts the unit's all-gather (its memory allocated), unless it is gathered or on its way.
  void start_gather(FlatUnit& unit);
  // The unit whole: its prefetch waited for, or gathered now.
  void gather(FlatUnit& unit);
  // Unit u (an index of units_) whole for its forward, and the next one's gather started; for its
  // backward, the previous one's.
  void gather_for_forward(size_t u);
  void gather_for_backward(size_t u);
  // A unit's parameters' .grad made views of its flat gradient buffer (what they held copied in),
  // so that autograd accumulates into it and it is reduce-scattered as it lies.
  void attach_gradients(FlatUnit& unit);
  void release(FlatUnit& unit);
  // The unit's backward has run: reduce when due, release.
  void finish_unit_backward(FlatUnit& unit);
  // The micro-step's gathers and reductions that this rank has not run yet (all of them when it
  // had no samples), in the order its peers run them.
  void replay_micro_step();
  // Sums the unit's .grad over the ranks into its gradient shard and releases .grad.
  void reduce(FlatUnit& unit);
  bool reduce_due(const FlatUnit& unit) const { return unit.policy == GradShardPolicy::each_micro_step || last_; }

  c10::intrusive_ptr<c10d::Backend> group_;
  std::vector<torch::Tensor> params_;
  ShardedGradSyncOptions options_;
  std::vector<FlatUnit> units_;              // the model's units that hold parameters, then the root
  size_t unit_count_ = 0;                    // of them, not the root
  std::vector<int64_t> unit_of_model_unit_;  // model unit → index into units_, or -1
  std::string policy_reason_;
  bool last_ = false;
  bool computed_ = false;   // this micro-step entered a unit on this rank
  bool abandoned_ = false;  // and stopped part-way (abandon_micro_step)
  bool in_window_ = false;
  bool unsharded_ = false;
  int64_t calls_ = 0, bytes_ = 0, gathers_ = 0;
  int64_t window_calls_ = 0, window_bytes_ = 0, window_gathers_ = 0;
};

}  // namespace gradaccum::dist
