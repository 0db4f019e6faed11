// libtorch's AdamW with each parameter's update fused into one pass.
//
// torch::optim::AdamW (the C++ frontend's) updates a parameter with eight tensor
// operators (decay, two moment updates, sqrt, division, addition of eps, the
// step), each a dispatch, a TensorIterator set-up and a pass over memory. For
// small models that fixed cost is most of the optimizer step
// (bench/mlp_microstep). This optimizer hands the parameters of each group, per
// device and dtype, to libtorch's fused AdamW in one call (at::_fused_adamw_,
// what torch.optim.AdamW(fused=True) runs in Python, on the CPU and on CUDA):
// the formulas of AdamW (Loshchilov & Hutter) in PyTorch's order of operations,
// to rounding (tests/optim/fused_adamw_test.cpp).
//
// A parameter with a non-contiguous tensor (parameter, gradient or moment)
// takes torch::optim::AdamW's operator sequence instead: the fused op's CPU
// kernel walks the four tensors' memory in step and mis-updates such a
// parameter (torch 2.15). State, options, state dicts and serialization are
// AdamW's, unchanged.
//
// (Until 2026-11 this engine had its own CPU loop here, written for libtorch
// 1.13, which had no fused AdamW. Against at::_fused_adamw_ it won nothing end
// to end: -3.1% on the GPT benchmark, -5.2% on seed 000's MLP, +2.6% on the CNN
// (BENCHMARKS.md), so it was deleted.)
#pragma once

#include <torch/torch.h>

#include <vector>

namespace gradaccum::optim {

class FusedAdamW : public torch::optim::AdamW {
 public:
  FusedAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults)
      : torch::optim::AdamW(std::move(params), std::move(defaults)) {}
  FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions defaults)
      : torch::optim::AdamW(std::move(groups), std::move(defaults)) {}

  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace gradaccum::optim
