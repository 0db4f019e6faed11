// A model's units: the groups of parameters that compute together (a decoder block, a top-level
// module of a network), which the engine may keep sharded outside their computation (ZeRO-3).
//
// The model says what its units are (Trainable::units()) and brackets each unit's computation in
// its forward: `x = scope.enter(u, x)` before it, `y = scope.leave(u, y)` after. It knows nothing
// else of what the engine does there; the engine knows nothing else of the model. Without a scope
// installed (the default) a model runs its units plainly.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace gradaccum::core {

// Each unit's trainable parameters, in the order the forward computes the units. A parameter
// belongs to one unit at most; parameters in none (embeddings, a head, a final norm) are the
// model's root, which stays whole.
using ParameterUnits = std::vector<std::vector<torch::Tensor>>;

class UnitScope {
 public:
  virtual ~UnitScope() = default;
  // Just before unit `unit` reads `input`: returns the tensor the unit reads instead (the same
  // values). Its parameters hold their values from here until leave().
  virtual torch::Tensor enter(int64_t unit, const torch::Tensor& input) = 0;
  // Just after the unit made `output`: returns the tensor the rest of the forward reads instead.
  virtual torch::Tensor leave(int64_t unit, const torch::Tensor& output) = 0;
};

// unit(input) between the scope's enter and leave; unit(input) alone when `scope` is null.
template <typename Fn>
torch::Tensor run_unit(UnitScope* scope, int64_t unit, const torch::Tensor& input, Fn&& fn) {
  if (scope == nullptr) return fn(input);
  return scope->leave(unit, fn(scope->enter(unit, input)));
}

}  // namespace gradaccum::core
