// The softmax cross-entropy of a block of logit rows together with its
// gradient, computed in place, one row at a time: what the fused LM-head loss
// (models/chunked_cross_entropy.h) does with each chunk of logits on the CPU.
//
// Why hand-written: against libtorch 2.15's log_softmax + gather path
// (custom_kernels without softmax_cross_entropy) the GPT benchmark is 10.4%
// faster with it (bench/custom_kernels.py, BENCHMARKS.md). It was written
// because libtorch 1.13 computed a CPU cross-entropy as log_softmax
// followed by nll_loss, and their backward separately. For a [1024, 8192]
// float32 chunk on 2 threads, log_softmax alone took 12.9 ms, and the gradient
// then cost an exp pass, a scatter and (under bf16) two casts of the whole
// chunk. This version reads each row from memory once and writes it once: the
// row stays in the core's cache between its three passes (maximum,
// exponentials, scaling).
#pragma once

#include <torch/torch.h>

namespace gradaccum::kernels {

// Whether softmax_cross_entropy_ takes these logits: a contiguous 2-D CPU
// tensor of float32, bfloat16 or float64.
bool softmax_cross_entropy_supports(const torch::Tensor& logits);

// For each row r of logits [R, V]:
//   loss_r    = log Σ_v exp(logits[r, v]) − logits[r, targets[r]]
//   logits[r] ← w_r · (softmax(logits[r]) − onehot(targets[r]))   (in place)
// where w_r = row_weights[r], or 1 when row_weights is undefined. Returns
// Σ_r w_r · loss_r in float64. A row with w_r = 0 becomes zeros and adds
// nothing, whatever its logits hold.
//
//   targets      [R] int64, each in [0, V)
//   row_weights  [R] float32 or float64 (e.g. 1 = scored, 0 = padding), or undefined
//
// Arithmetic is float32 for float32 and bfloat16 logits (the bfloat16 gradient
// is rounded once, from the float32 value, as .to(kBFloat16) rounds) and
// float64 for float64. The result does not depend on the number of threads:
// each row is computed by one thread, and the rows' losses are summed in order.
//
// Throws gradaccum::Error for logits it does not support, mismatched shapes,
// or a target outside [0, V).
double softmax_cross_entropy_(torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& row_weights);

// The sum of the softmax cross-entropies of blocks of logit rows, each block's gradient
// computed with it: what the fused LM-head loss asks for chunk after chunk. A block runs
// through softmax_cross_entropy_ where custom_kernels has softmax_cross_entropy
// (kernels/custom_kernels.h), softmax_cross_entropy_supports() its logits and the kernel
// computes in the sum's dtype; anywhere else (any device) through libtorch's log_softmax +
// gather in the sum's dtype, which reads nothing on the host.
class SoftmaxCrossEntropySum {
 public:
  // `options`: the sum's device and dtype, float32 (or float64 for float64 logits).
  explicit SoftmaxCrossEntropySum(const torch::TensorOptions& options);

  // Adds Σ_r w_r · loss_r of `logits` [R, V] (as softmax_cross_entropy_ above; targets [R]
  // int64 in [0, V), row_weights [R] in the sum's dtype or undefined for all 1). With
  // `gradient`, returns w_r · (softmax(logits[r]) − onehot(targets[r])) in logits' dtype,
  // written in place of the logits where the kernel runs; without it, the kernel's
  // in-place result or an undefined tensor.
  torch::Tensor add(torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& row_weights,
                    bool gradient);

  // The sum of every block added: a 0-dim tensor of the constructor's options.
  torch::Tensor sum();

 private:
  torch::Tensor libtorch_sum_;  // the blocks libtorch computed, on the device
  double kernel_sum_ = 0.0;     // the blocks the kernel computed, on the host
};

}  // namespace gradaccum::kernels
