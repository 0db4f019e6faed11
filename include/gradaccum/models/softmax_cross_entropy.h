// The softmax cross-entropy of a block of logit rows together with its
// gradient, computed in place, one row at a time: what the fused LM-head loss
// (chunked_cross_entropy.h) does with each chunk of logits on the CPU.
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

namespace gradaccum::models {

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

}  // namespace gradaccum::models
