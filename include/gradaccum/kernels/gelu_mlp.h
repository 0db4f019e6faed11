// Linear → GELU → Linear as one autograd node on tiny CPU inputs.
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
// function; tests/kernels/gelu_mlp_test.cpp holds them to each other and to finite
// differences. The module that holds the weights is models::GeluMlp (models/networks.h).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace gradaccum::kernels {

// linear(gelu(linear(x, w1, b1)), w2, b2), GELU the exact (erf) one:
//   x [rows, in], w1 [hidden, in], b1 [hidden], w2 [out, hidden], b2 [out] → [rows, out].
// Fused when gelu_mlp_fuses(...); otherwise libtorch's torch::linear and torch::gelu.
// Differentiating the fused result twice (create_graph) throws c10::Error.
torch::Tensor gelu_mlp(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                       const torch::Tensor& w2, const torch::Tensor& b2);

// custom_kernels has gelu_mlp (kernels/custom_kernels.h); no CPU autocast; x is a matrix with
// w1's input width; x and the four parameters are contiguous CPU tensors of one dtype, float32
// or float64; and rows × (in × hidden + hidden × out) ≤ kGeluMlpMaxFusedMultiplyAdds.
bool gelu_mlp_fuses(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1, const torch::Tensor& w2,
                    const torch::Tensor& b2);

// Largest rows × (in × hidden + hidden × out) the fused path takes. Above
// it the matrix products dominate and BLAS does them better than loops.
constexpr int64_t kGeluMlpMaxFusedMultiplyAdds = 1 << 16;

}  // namespace gradaccum::kernels
