// GroupNorm over a channels-last image batch, as one autograd node with its own
// forward and backward on the CPU.
//
// The CNN runs channels-last on the CPU (models/memory_format.h) because
// libtorch's channels-last max-pool and convolutions are much faster there, but
// libtorch's channels-last GroupNorm is not: its kernel vectorizes over the
// channels of one group, and with the CNN's 32 channels in 8 groups that is 4
// floats, shorter than a vector. On 2 threads of an AVX2 EPYC its forward on a
// [16, 32, 28, 28] batch took 1.0 ms against 0.12 ms for the same batch in NCHW,
// and it was the largest difference between the engine's and the NCHW eager
// loop's trace at 16 × 4 (docs/benchmarks-history.md). This kernel reads a
// sample as rows of all its channels, so every loop runs over the whole row.
//
// Why hand-written: ATen's GroupNorm kernels are not reachable per layout from
// outside, and recomposing the statistics from libtorch reductions over the
// strided group dimensions (var_mean) was slower still (2.0 ms). Against
// libtorch's path (custom_kernels without group_norm) the default CNN run is
// 21.7% faster with it at 64 × 1, 8.4% at 16 × 4 and 4.2% at 4 × 16 (medians of
// 3 alternating processes, AVX2 EPYC; bench/custom_kernels.py --bench cnn,
// BENCHMARKS.md). A single image per micro-batch stays NCHW and never reaches it.
#pragma once

#include <torch/torch.h>

namespace gradaccum::kernels {

// torch::group_norm(x, groups, weight, bias, eps) for x of [N, C, ...] and
// weight, bias of [C] (or undefined: no affine). Fused when group_norm_fuses(...);
// otherwise libtorch's group_norm, with its checks and errors. The fused node
// computes each sample's statistics in float64 (in float32 blocks of 64 pixels
// for float32 input), so its result equals libtorch's to float rounding
// (tests/kernels/group_norm_test.cpp). Differentiating the fused result twice
// (create_graph) throws gradaccum::Error.
torch::Tensor group_norm(const torch::Tensor& x, int64_t groups, const torch::Tensor& weight, const torch::Tensor& bias,
                         double eps);

// custom_kernels has group_norm (kernels/custom_kernels.h); x is a 4-D CPU
// float32 or float64 batch that is channels-last and not also NCHW-contiguous
// (one channel, or 1 × 1 images); weight and bias are defined, of x's dtype and
// device; groups divides the channels.
bool group_norm_fuses(const torch::Tensor& x, int64_t groups, const torch::Tensor& weight, const torch::Tensor& bias);

}  // namespace gradaccum::kernels
