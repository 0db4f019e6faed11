// In-process preemption inside a window: a dataset that raises the stop flag while a chosen
// micro-batch is fetched, and a checkpoint hook that keeps what a preempted run saves in memory,
// so that a fresh trainer can be restored from it.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "gradaccum/core/trainable.h"
#include "gradaccum/core/training_state.h"
#include "gradaccum/formats/safetensors.h"
#include "gradaccum/models/module_tensors.h"
#include "gradaccum/optim/optimizer_state.h"

namespace gradaccum::testing {

// `inner`, raising `stop` when the `fetches`-th micro-batch is fetched.
class StopAfterFetches final : public core::Dataset {
 public:
  StopAfterFetches(const core::Dataset& inner, std::atomic<bool>& stop, int64_t fetches)
      : inner_(inner), stop_(stop), left_(fetches) {}
  int64_t size() const override { return inner_.size(); }
  core::Batch get(const torch::Tensor& indices, torch::ScalarType dtype) const override {
    if (--left_ == 0) stop_ = true;
    return inner_.get(indices, dtype);
  }
  torch::Tensor sample_lengths() const override { return inner_.sample_lengths(); }
  torch::Tensor sample_items() const override { return inner_.sample_items(); }

 private:
  const core::Dataset& inner_;
  std::atomic<bool>& stop_;
  mutable int64_t left_;
};

// Keeps the state, weights and optimizer of a preempted save (other saves are ignored).
class MemoryHook final : public core::CheckpointHook {
 public:
  void save(const core::TrainingState& state, core::SaveReason reason) override {
    if (reason != core::SaveReason::preempted) return;
    saved = state;
    optimizer = formats::serialize_safetensors(optim::optimizer_state(*optimizer_, names_));
    weights = models::module_tensors(*module_);
  }
  torch::optim::Optimizer* optimizer_ = nullptr;
  optim::NamedParameters names_;
  torch::nn::Module* module_ = nullptr;
  core::TrainingState saved;
  std::string optimizer;
  std::vector<std::pair<std::string, torch::Tensor>> weights;
};

}  // namespace gradaccum::testing
