// BLOOM (BigScience 2022) in libtorch, structured like Hugging Face's
// modeling_bloom so that parameter names match theirs:
//
//   transformer.word_embeddings.weight              token embedding [vocab, hidden]
//   transformer.word_embeddings_layernorm.{weight,bias}
//   transformer.h.<i>.input_layernorm.{weight,bias}
//   transformer.h.<i>.self_attention.query_key_value.{weight,bias}   fused q, k, v
//   transformer.h.<i>.self_attention.dense.{weight,bias}
//   transformer.h.<i>.post_attention_layernorm.{weight,bias}
//   transformer.h.<i>.mlp.dense_h_to_4h.{weight,bias}
//   transformer.h.<i>.mlp.dense_4h_to_h.{weight,bias}
//   transformer.ln_f.{weight,bias}
//
// The LM head is tied to word_embeddings (HF's lm_head.weight is that tensor).
// HF uses nn.Linear here, so weights are [out, in] as in a checkpoint: no
// transpose, unlike GPT-2's Conv1D.
//
// What differs from GPT-2 (gpt2.h):
// - a LayerNorm right after the token embedding (word_embeddings_layernorm);
// - no position embeddings: ALiBi (Press et al. 2022) adds slope_h × (key
//   position) to head h's scaled scores q·kᵀ/√head_dim. Key positions come
//   from the attention mask, (cumsum(mask) - 1)·mask, so left and right
//   padding give real tokens the same positions and thus the same logits;
//   with no position table, any length is accepted (max_positions() = 0);
// - the fused query_key_value output is laid out per head, [B, T, n_head, 3,
//   head_dim], not as q | k | v blocks.
// Both: causal mask ∧ key is real (kernels/masked_softmax.h), tanh-GELU MLP
// of width 4·hidden, pre-LayerNorm residual blocks (HF's
// apply_residual_connection_post_layernorm = false), final ln_f. Dropout at HF's places
// (attention probabilities; each residual branch's output, HF's dropout_add), off by default,
// drawn per sample (sample_dropout.h) unless dropout_rng says libtorch.
//
// The GELU is HF's BLOOM GELU exactly, with √(2/π) written as the literal
// 0.79788456 (bloom_gelu): torch's tanh GELU, with the exact constant, moves
// logits by ~1e-10 relative, which a float64 comparison with HF would see.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>

#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/decoder.h"
#include "gradaccum/models/sample_dropout.h"

namespace gradaccum::models {

// Field names as in HF's BloomConfig. vocab_size is BLOOM's tokenizer's; the
// other defaults make a tiny model (bloom-560m: hidden 1024, 24 layers, 16 heads).
struct BloomConfig {
  int64_t vocab_size = 250880;
  int64_t hidden_size = 64;
  int64_t n_layer = 2;
  int64_t n_head = 8;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  // Seed of the initialization's own generator: equal configs give equal
  // weights, independent of the global RNG.
  uint64_t init_seed = 0;
  bool tie_word_embeddings = true;  // the LM head is word_embeddings (false: its own lm_head.weight)
  // Dropout probabilities (HF's names and defaults): each residual branch's output, and the
  // attention probabilities.
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  DropoutRng dropout_rng = DropoutRng::per_sample;
};

// ALiBi's per-head slopes, [n_head] float64. With p the largest power of two ≤
// n_head: base^1 .. base^p for base = 2^(-2^-(log2(p) - 3)) = 2^(-8/p), then
// for the remaining n_head - p heads the odd powers 1, 3, 5, ... of
// 2^(-2^-(log2(2p) - 3)) = 2^(-4/p) (the slopes of 2p heads that the first p
// skipped). n_head 8: 2^-1 .. 2^-8.
torch::Tensor bloom_alibi_slopes(int64_t n_head);

// ALiBi biases [B, n_head, 1, T] in `dtype`: slope_h × key position, the key
// position being (cumsum(mask) - 1)·mask (0 at padding), or 0 .. T-1 when
// attention_mask is undefined (then B = 1).
torch::Tensor bloom_alibi(const torch::Tensor& attention_mask, int64_t time, int64_t n_head, torch::ScalarType dtype,
                          torch::Device device = torch::kCPU);
// The attention's additive bias [B or 1, H, T, T] in alibi's dtype: alibi where `allowed`
// ([B or 1, 1, T, T]), elsewhere the lowest value of `scores_dtype` (default: alibi's dtype), the
// dtype the attention computes in; what the attention adds to its scores under dropout. Adding
// scores to the lowest value leaves it, so masking the scores afterwards changes nothing. Under
// 16-bit autocast the scores are 16-bit: float32's lowest has no bfloat16 or float16 value, and
// would round to -inf (a fully masked row's softmax would be NaN).
torch::Tensor bloom_attention_bias(const torch::Tensor& alibi, const torch::Tensor& allowed,
                                   std::optional<torch::ScalarType> scores_dtype = std::nullopt);

// Self-attention with the fused, per-head-interleaved query_key_value.
class BloomAttentionImpl : public torch::nn::Module {
 public:
  // `layer`: the block's index (numbers its dropout sites).
  BloomAttentionImpl(const BloomConfig& config, int64_t layer);
  // x [B, T, C]; alibi [B or 1, H, 1, T] (bloom_alibi); allowed [B or 1, 1, T, T] bool.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& alibi, const torch::Tensor& allowed);

  torch::nn::Linear query_key_value{nullptr};
  torch::nn::Linear dense{nullptr};
  SampleDropout attention_dropout{nullptr};  // on the probabilities
  SampleDropout hidden_dropout{nullptr};     // on the output

 private:
  int64_t n_head_;
};
TORCH_MODULE(BloomAttention);

// HF's bloom_gelu_forward: x/2 · (1 + tanh(0.79788456 · x · (1 + 0.044715 x²))),
// the tanh approximation of GELU with BLOOM's literal for √(2/π). Its gradient is
// HF's hand-written bloom_gelu_back (what HF trains with), computed from the saved
// input alone. Where gelu_tanh_fuses(x) (contiguous float32 or bfloat16 on the CPU) it is
// kernels/gelu_tanh's fused kernel: in float32 the literal and √(2/π) are the same float,
// and HF's chain of ATen operators was the largest cost after the GEMMs and attention in
// a traced BLOOM-560m step (BENCHMARKS.md).
torch::Tensor bloom_gelu(const torch::Tensor& x);

// Linear(C, 4C) → bloom_gelu → Linear(4C, C).
class BloomMlpImpl : public torch::nn::Module {
 public:
  BloomMlpImpl(const BloomConfig& config, int64_t layer);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear dense_h_to_4h{nullptr};
  torch::nn::Linear dense_4h_to_h{nullptr};
  SampleDropout hidden_dropout{nullptr};
};
TORCH_MODULE(BloomMlp);

// Pre-LayerNorm residual block: x + attn(input_layernorm(x)), then
// + mlp(post_attention_layernorm(·)).
class BloomBlockImpl : public torch::nn::Module {
 public:
  BloomBlockImpl(const BloomConfig& config, int64_t layer);
  // As BloomAttentionImpl::forward.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& alibi, const torch::Tensor& allowed);

  torch::nn::LayerNorm input_layernorm{nullptr};
  BloomAttention self_attention{nullptr};
  torch::nn::LayerNorm post_attention_layernorm{nullptr};
  BloomMlp mlp{nullptr};
};
TORCH_MODULE(BloomBlock);

// HF's BloomModel: embedding, its LayerNorm, blocks, ln_f → [B, T, hidden].
// Initialized in its constructor as HF's _init_weights: Linear and Embedding
// weights N(0, initializer_range), biases 0, LayerNorm (1, 0), drawn from a
// generator seeded with config.init_seed in registration order.
class BloomModelImpl : public DecoderImpl {
 public:
  explicit BloomModelImpl(const BloomConfig& config);
  // input_ids [B, T] int64; attention_mask [B, T] (1 = real token) or undefined.
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {});

  torch::Tensor hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                              const TokenEmbeddingGrad& embedding_grad = TokenEmbeddingGrad::dense()) override;
  torch::Tensor token_embedding() override { return word_embeddings->weight; }
  int64_t hidden_size() const override { return config_.hidden_size; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_positions() const override { return 0; }  // ALiBi: unbounded
  const BloomConfig& config() const { return config_; }

  torch::nn::Embedding word_embeddings{nullptr};
  torch::nn::LayerNorm word_embeddings_layernorm{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};

 protected:
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() const override { return h->children(); }

 private:
  BloomConfig config_;
};
TORCH_MODULE(BloomModel);

// BloomForCausalLM: the generic causal-LM head (causal_lm.h) on a BloomModel.
class BloomForCausalLmImpl : public CausalLmHeadImpl {
 public:
  explicit BloomForCausalLmImpl(const BloomConfig& config) : BloomForCausalLmImpl(BloomModel(config)) {}
  const BloomConfig& config() const { return bloom_->config(); }
  BloomModel& bloom() { return bloom_; }

 private:
  explicit BloomForCausalLmImpl(BloomModel bloom)
      : CausalLmHeadImpl(as_decoder(bloom), bloom->config().tie_word_embeddings), bloom_(bloom) {}
  BloomModel bloom_;  // the module registered as `transformer`, not registered twice
};
TORCH_MODULE(BloomForCausalLm);

}  // namespace gradaccum::models
