// Multi-head scaled dot-product attention from a fused query-key-value
// projection (GPT-2's c_attn, BLOOM's query_key_value with its ALiBi bias),
// with its own forward and backward on the CPU.
//
// libtorch runs attention as ~12 operators per layer and direction: the split,
// head transposes, two batched matmuls, the scaling, masked_fill, softmax, and
// in the backward their mirror images plus a cat of the three gradients.
// libtorch 1.13's CPU bmm multiplies the batch's matrices one after another
// (~100 GFLOP/s on this machine's 128 × 128 × 64 products, on one core
// whatever the thread count), and every other operator makes a pass over
// [B, H, T, T] in memory. Here each (batch, head) pair is one task of a
// parallel loop: its two products (four in the backward) go straight to BLAS
// and the masked softmax and its gradient run on rows still in cache. Queries
// go in blocks of 16 to 64 rows (by sequence length) whose products stop at the
// block's last allowed key, so a causal mask skips most of the upper triangle's
// work (the skipped probabilities are exactly 0). The gradient is written into
// one [B, T, 3C] tensor, laid out like qkv.
//
// The probabilities are kept for the backward ([B, H, T, T] per layer, 16 MB a
// BLOOM-560m layer at 512 tokens), where flash attention keeps one value per row
// and computes them again.
//
// Why hand-written: it still beats libtorch's own path. With custom_kernels
// off (kernels/custom_kernels.h) the same function runs through
// at::scaled_dot_product_attention; against that, this kernel makes the GPT
// benchmark 13.5% faster end to end on libtorch 2.15 (bench/custom_kernels.py,
// BENCHMARKS.md), and one BLOOM-560m layer's attention at 512 tokens with ALiBi
// takes 0.48–0.51× its time, forward and backward, on the 2-core AVX-512 EPYC
// (bench/attention_ab; 0.52–0.54× without a bias). Its loops flush denormals
// (kernels/flush_denormals.h): without that ALiBi's tiny probabilities made it
// 2.5× slower than libtorch. Written for libtorch 1.13, which had no fused
// attention.
#pragma once

#include <torch/torch.h>

#include <functional>

namespace gradaccum::kernels {

// How qkv's last dimension holds the heads' queries, keys and values.
enum class QkvPacking {
  by_part,  // GPT-2's c_attn: [q of every head | k of every head | v of every head]
  by_head,  // BLOOM's query_key_value: [q k v of head 0 | q k v of head 1 | ...]
};

struct QkvAttentionOptions {
  QkvPacking packing = QkvPacking::by_part;
  // Added to every score on key s, per head: [B or 1, H, 1, T], BLOOM's ALiBi. Undefined:
  // none. No gradient flows into it.
  torch::Tensor key_bias;
};

// The attention of every head, heads concatenated:
//   q, k, v = the heads' queries, keys and values in qkv (options.packing), each
//             head D = C / n_head channels;
//   y[b, t, head h] = Σ_s p[b, h, t, s] · v[b, s, head h], where
//   p[b, h, t, ·] = softmax over s of q·k / √D + key_bias[b or 0, h, 0, s],
//                   restricted to the keys with allowed[b or 0, 0, t, s]; a row
//                   with no allowed key attends uniformly to all T keys (HF's
//                   convention: the masked scores hold the dtype's lowest value).
//
//   qkv      [B, T, 3C]
//   allowed  [B or 1, 1, T, T] bool
//   returns  [B, T, C]
//
// Exactly qkv_attention_reference() (the libtorch expression), to rounding;
// tests/kernels/qkv_attention_test.cpp holds them to each other. The fused path runs
// when qkv_attention_fuses() says so; otherwise this is qkv_attention_sdpa().
// Differentiating the result twice (create_graph) is refused with
// gradaccum::Error on the fused path.
torch::Tensor qkv_attention(const torch::Tensor& qkv, int64_t n_head, const torch::Tensor& allowed,
                            const QkvAttentionOptions& options = {});

// The fused path's conditions: custom_kernels has qkv_attention
// (kernels/custom_kernels.h), CPU, contiguous qkv, allowed and key_bias (which
// needs no gradient), a BLAS that exports sgemm_/dgemm_, and either float32 or
// float64 qkv without CPU autocast, or bfloat16 (float16) qkv under bfloat16
// (float16) CPU autocast (what the projection returns there). The 16-bit case
// computes in float32 on the 16-bit values and rounds the result to 16 bits: the
// softmax is float32 under autocast anyway.
bool qkv_attention_fuses(const torch::Tensor& qkv, int64_t n_head, const torch::Tensor& allowed,
                         const QkvAttentionOptions& options = {});

// The same function through libtorch's at::scaled_dot_product_attention (its
// fused kernels on every device), `allowed` and key_bias given to it as one
// additive mask in qkv's dtype.
torch::Tensor qkv_attention_sdpa(const torch::Tensor& qkv, int64_t n_head, const torch::Tensor& allowed,
                                 const QkvAttentionOptions& options = {});

// The same function as libtorch operators (split, matmul, masked_softmax,
// matmul); any device, dtype and autocast.
torch::Tensor qkv_attention_reference(const torch::Tensor& qkv, int64_t n_head, const torch::Tensor& allowed,
                                      const QkvAttentionOptions& options = {});
// qkv_attention_reference with `on_probabilities` applied to p [B, H, T, T] before it weighs v
// (dropout on the attention probabilities).
torch::Tensor qkv_attention_transformed(const torch::Tensor& qkv, int64_t n_head, const torch::Tensor& allowed,
                                        const std::function<torch::Tensor(const torch::Tensor&)>& on_probabilities,
                                        const QkvAttentionOptions& options = {});

}  // namespace gradaccum::kernels
