// libtorch's AdamW with the update of each parameter fused into one pass.
//
// torch::optim::AdamW updates a parameter with eight tensor operators (decay,
// two moment updates, sqrt, division, addition of eps, the step), each a
// dispatch, a TensorIterator set-up and a pass over memory. For small models
// that fixed cost is most of the optimizer step (bench/mlp_microstep). Here
// every parameter whose tensors are contiguous is updated in one pass: by
// libtorch's own fused AdamW (at::_fused_adamw_, what torch.optim.AdamW(fused=True)
// runs, on any device), or, with the custom kernel fused_adamw on
// (core/custom_kernels.h), for a CPU parameter in float32 or float64, by this
// engine's loop, element by element in the parameter's dtype, with the
// formulas of AdamW (Loshchilov & Hutter; PyTorch's order of operations):
//
//   p ← p·(1 − lr·λ);  m ← β₁m + (1 − β₁)g;  v ← β₂v + (1 − β₂)g²
//   p ← p − lr/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)
//
// Results agree with libtorch's to rounding (not bit for bit: its kernels use
// fused multiply-adds in some places), except that subnormal moments are
// flushed to zero (see FlushSubnormals in the .cpp: an effect below the
// parameters' rounding, and a 10x slower loop without it). A parameter with a
// non-contiguous tensor takes libtorch's operator sequence (the fused op
// mis-updates those). State, options, state dicts and serialization are
// AdamW's, unchanged.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace gradaccum::optim {

class FusedAdamW : public torch::optim::AdamW {
 public:
  FusedAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults)
      : torch::optim::AdamW(std::move(params), std::move(defaults)) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace gradaccum::optim
