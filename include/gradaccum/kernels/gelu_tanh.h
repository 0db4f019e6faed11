// The tanh GELU of GPT-2 (HF's "gelu_new") and BLOOM, as one autograd node
// with its own vectorized forward and backward on the CPU:
//   gelu(x) = x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))
//
// libtorch 1.13's CPU kernels take ~1.1 ns per element for the forward and as
// much for the backward on float32 (8 × 128 × 768 elements per GPT block and
// micro-step here), and its bfloat16 kernels are slower than casting to
// float32 and back. This computes in float32 for float32 and bfloat16 inputs,
// with tanh from one exponential (kernels/vector_exp.h), reading and writing
// each element once per direction.
//
// Why hand-written: libtorch's fast vectorized tanh lives inside ATen's own
// kernels, which cannot be fused with anything from outside. Against libtorch
// 2.15's torch::gelu (custom_kernels without gelu_tanh) the GPT benchmark is
// 5.8% faster with it (medians of 11 alternating processes each; its fastest
// steps only 2.3%): just above the 5% a kernel must win to stay
// (bench/custom_kernels.py, BENCHMARKS.md). BLOOM's GELU (models/bloom.h) runs
// through it too, where it replaces HF's chain of elementwise operators: 6.4%
// off BLOOM-560m's fp32 step on the Xeon (docs/benchmarks-history.md).
#pragma once

#include <torch/torch.h>

namespace gradaccum::kernels {

// torch::gelu(x, "tanh") to float32 rounding (tests/kernels/gelu_tanh_test.cpp), same
// dtype as x. Fused when gelu_tanh_fuses(x); otherwise libtorch's gelu in x's
// dtype (libtorch 2.x's 16-bit CPU GELU is vectorized: the float32 detour that
// 1.13 needed is gone). Differentiating the fused result twice (create_graph)
// throws gradaccum::Error.
torch::Tensor gelu_tanh(const torch::Tensor& x);

// custom_kernels has gelu_tanh (kernels/custom_kernels.h), and x is contiguous CPU
// float32 or bfloat16.
bool gelu_tanh_fuses(const torch::Tensor& x);

}  // namespace gradaccum::kernels
