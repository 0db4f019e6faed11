// Attention's masked softmax as libtorch operators, and the fill value it masks with: the
// convention the fused attention (kernels/qkv_attention.h) reproduces and the path it falls
// back to, which the decoders' own attention expressions (dropout on the probabilities, HF's
// operator order) use too.
#pragma once

#include <torch/torch.h>

namespace gradaccum::kernels {

// The most negative finite value of `dtype` (double, float, bfloat16, half; float's
// for any other): what attention masks fill where a key is not allowed, since -inf
// would make a row without any allowed key NaN.
double lowest_finite(torch::ScalarType dtype);

// Softmax over the last dimension of `scores` where `allowed`, as HF does it:
// disallowed scores become the dtype's lowest finite value, not -inf, so a
// query that sees no real key (a pad query under left padding) gets a uniform
// distribution instead of NaN, while for every query with a real key
// exp(lowest - max) is exactly 0 and padding stays invisible.
torch::Tensor masked_softmax(const torch::Tensor& scores, const torch::Tensor& allowed);

}  // namespace gradaccum::kernels
