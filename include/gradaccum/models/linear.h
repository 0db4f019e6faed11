// A Linear layer applied through ATen's linear operator.
//
// libtorch 1.13's C++ frontend (torch::nn::Linear::forward, i.e.
// torch::nn::functional::linear) fuses the bias into the GEMM only for 2-D
// inputs; on the [batch, time, features] activations of a decoder it runs a
// matmul and then a separate bias add. The matmul asks BLAS for C = A·B with
// beta = 0, and OpenBLAS first clears C in a pass of its own (sgemm_beta),
// then the add reads and writes the output once more. ATen's at::linear (what
// Python's F.linear calls) flattens a contiguous 3-D input and runs one addmm
// with the bias broadcast into C and beta = 1: a GPT-2 block's four Linear
// layers of bench/lm_throughput take 7% less time on the 2-core AVX2 EPYC
// (bench/py/linear_bias_fusion.py, BENCHMARKS.md). Same parameters, same
// function; only the order of one addition differs.
//
// A layer with a LoRA adapter (lora.h) adds the adapter's term, as PEFT's
// lora.Linear does: base(x) + scaling · B(A(dropout(x))). A frozen base held
// in another dtype than the activations (lora.base_dtype: bfloat16) multiplies
// in its own dtype and hands back the activations' dtype.
#pragma once

#include <torch/torch.h>

#include "gradaccum/models/lora_adapter.h"

namespace gradaccum::models {

inline torch::Tensor linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  const auto& weight = layer->weight;
  auto y = weight.scalar_type() == x.scalar_type()
               ? at::linear(x, weight, layer->bias)
               : at::linear(x.to(weight.scalar_type()), weight, layer->bias).to(x.scalar_type());
  if (auto* adapter = lora_adapter_of(*layer)) return y + adapter->forward(x);
  return y;
}

}  // namespace gradaccum::models
