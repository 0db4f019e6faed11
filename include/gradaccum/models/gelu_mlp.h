// Linear → GELU → Linear as one module, with a fused path for tiny inputs.
//
// For a network this small (seed 000's 16 → 32 → 1) the arithmetic of a
// micro-step is a few thousand multiply-adds; what costs is libtorch's fixed
// price per operator and per autograd node (dispatch, TensorIterator set-up,
// oneDNN's GELU primitive, one node per addmm, transpose and activation). So
// on the CPU, when the matrices are small, the whole network is one autograd
// node whose forward and backward are plain loops: 5 operators (2 × transpose
// and addmm, GELU) and 9 nodes (theirs and the 4 gradient accumulators) per
// micro-step become 1 and 5 (the node and the accumulators).
// Anything else (a GPU, autocast, large matrices, other dtypes, custom_kernels
// without gelu_mlp) runs the ordinary Linear → GELU → Linear of libtorch.
// On libtorch 2.15 the node makes seed 000's micro-step 2.6x shorter
// (bench/custom_kernels.py: 45 vs 115 µs). Both paths compute the same
// function; tests/models/gelu_mlp_test.cpp holds them to each other and to finite
// differences.
#pragma once

#include <torch/torch.h>

namespace gradaccum::models {

class GeluMlpImpl : public torch::nn::Module {
 public:
  // Parameters are named as in the Sequential Linear(in, hidden) → GELU →
  // Linear(hidden, out): "0.weight", "0.bias", "2.weight", "2.bias", and
  // initialized as those Linear layers are.
  GeluMlpImpl(int64_t in_features, int64_t hidden_features, int64_t out_features);

  // x: [rows, in] → [rows, out]; GELU is the exact (erf) one.
  torch::Tensor forward(const torch::Tensor& x);

  // Whether forward(x) takes the fused path (public for tests and benchmarks).
  bool fuses(const torch::Tensor& x) const;

  // Largest rows × (in × hidden + hidden × out) the fused path takes. Above
  // it the matrix products dominate and BLAS does them better than loops.
  static constexpr int64_t kMaxFusedMultiplyAdds = 1 << 16;

  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(GeluMlp);

}  // namespace gradaccum::models
