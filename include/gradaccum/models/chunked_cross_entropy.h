// The causal-LM loss of a tied LM head without the full logits: the projection
// hidden · weightᵀ and the cross-entropy are computed chunk by chunk of at most
// `chunk_tokens` target positions, and each chunk's gradients with them, in the
// forward, so training never holds a [tokens × vocab] tensor — only one
// [chunk_tokens × vocab] chunk at a time — and never recomputes one. With vocab
// 50257, 4096 tokens of plain logits are 0.8 GB in float32 before log_softmax
// and its gradient add as much again each; see bench/chunked_ce_memory.cpp for
// a measurement.
//
// Why hand-written: libtorch (1.13) has no fused linear + cross-entropy, and
// checkpointing the two ops would still materialize the full logits once in the
// backward.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "gradaccum/core/batch.h"
#include "gradaccum/models/tied_table_gradient.h"

namespace gradaccum::models {

// Which positions the vocabulary projection covers.
enum class TargetSelection {
  // compact on the CPU, masked on every other device.
  automatic,
  // Gathers the scored positions first: padding and ignored labels cost no
  // projection. Their number depends on the labels' values (nonzero()), so on
  // an accelerator this is a host synchronization on every call.
  compact,
  // Projects every position and zeroes the ignored ones' loss and gradient:
  // shapes never depend on values, so nothing waits for the device; padding
  // costs its share of the projection.
  masked,
};

// Exactly causal_lm_loss(linear(hidden, weight), labels) (causal_lm.h): labels
// are shifted (position t predicts labels[:, t + 1]); sum = Σ cross-entropy over
// the shifted labels != core::kIgnoreIndex, count = the number of those labels (a
// 0-dim int64 tensor on the labels' device, never read on the host).
//
//   hidden [B, T, H]  the decoder's final hidden states
//   weight [V, H]     the output projection (the tied token embedding)
//   labels [B, T]     int64 or int32 token ids, core::kIgnoreIndex = ignored
//
// Gradients: when grad mode is on and hidden or weight requires a gradient, the
// forward also computes d sum / d hidden and d sum / d weight (the matmuls of
// the backward) and keeps them until the backward, which only scales them by
// the incoming gradient: the forward costs what forward + backward of the head
// cost, the backward almost nothing. The kept gradient of weight is one more
// [V, H] buffer (float32) while the graph lives. Under no_grad only the sum is
// computed. The backward scales the kept gradients in place, so a graph can
// be differentiated once: a second backward through a retained graph throws
// gradaccum::Error. Differentiating twice (higher order) is not supported.
//
// Precision: the log-sum-exp and softmax run in float32 (float64 when the
// inputs are float64). Under autocast (CPU or CUDA, as active when this is
// called) the chunk matmuls run in the autocast dtype, the gradient matmuls
// too (they run in the forward); without it they run in the
// inputs' dtype. The sum is float32 (float64 for float64 inputs); the
// gradients come back in hidden's and weight's dtypes, zero at positions whose
// shifted label is ignored. A batch without targets gives sum 0, count 0.
//
// Throws gradaccum::Error for chunk_tokens ≤ 0, mismatched shapes, or (when
// compacting CPU labels, where the check costs no device synchronization) a
// label outside [0, V) that is not core::kIgnoreIndex.
//
// `tied_table`: when weight is a tied embedding table whose lookup was made with
// the same pairing (tied_table_gradient.h), the backward hands the weight's
// gradient to the lookup's backward, which adds its rows into it in place,
// instead of returning it to autograd.
core::LossSum chunked_causal_lm_loss(const torch::Tensor& hidden, const torch::Tensor& weight,
                                     const torch::Tensor& labels, int64_t chunk_tokens,
                                     TargetSelection selection = TargetSelection::automatic,
                                     const c10::intrusive_ptr<TiedTableGradient>& tied_table = {});

}  // namespace gradaccum::models
