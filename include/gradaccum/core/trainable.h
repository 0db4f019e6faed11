// What the engine needs from a model and from a dataset — nothing more.
// The engine never looks inside a model; models never see windows.
#pragma once

#include <torch/torch.h>

#include "gradaccum/core/batch.h"
#include "gradaccum/core/parameter_units.h"

namespace gradaccum::core {

// Sums over one evaluation batch (divided once over the whole eval set).
struct EvalSums {
  torch::Tensor loss_sum;  // 0-dim
  torch::Tensor count;     // 0-dim int64: items behind loss_sum
  torch::Tensor correct;   // 0-dim int64: correct predictions (undefined if not a classifier)
};

class Trainable {
 public:
  virtual ~Trainable() = default;
  // Training objective of one micro-batch as (sum, count).
  virtual LossSum loss(const Batch& batch) = 0;
  // Evaluation sums; called in eval mode under torch::NoGradGuard.
  virtual EvalSums evaluate(const Batch& batch) = 0;
  virtual torch::nn::Module& module() = 0;
  // The model's units (parameter_units.h); none by default, and then nothing can be sharded per
  // unit (zero_stage 3 refuses such a model).
  virtual ParameterUnits units() { return {}; }
  // The scope the forward brackets each unit in from now on (nullptr: none, the default).
  virtual void set_unit_scope(UnitScope* /*scope*/) {}
};

// A source of batches addressed by sample index.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // The samples `indices` (int64, any order) as one batch on the CPU; floating
  // inputs in `dtype`.
  virtual Batch get(const torch::Tensor& indices, torch::ScalarType dtype) const = 0;
  // Each sample's length in tokens (int64 [size()]) for length-grouped
  // windows; undefined when samples have no length.
  virtual torch::Tensor sample_lengths() const { return {}; }
  // Each sample's count of the items its loss counts — a causal language model's targets, the
  // tokens that are not ignore_index (int64 [size()]) — for windows closed by a token count
  // (window_tokens); undefined when the dataset does not know them before the forward pass.
  virtual torch::Tensor sample_items() const { return {}; }
};

}  // namespace gradaccum::core
