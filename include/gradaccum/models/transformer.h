// One configurable pre-norm decoder: the backbone of every architecture in the table
// (models/architectures.h), in the spirit of LitGPT's single GPT class with a config per family.
// What a family chooses is an option here, never a subclass:
//
//   positions   learned table, ALiBi, or RoPE with HF's scalings (models/rope.h)
//   norm        LayerNorm (weight and optional bias) or RMSNorm (weight), its eps
//   mlp         GELU (tanh) with up/down projections, or SwiGLU (gate, up, down), bias or not
//   attention   query heads, key-value heads (GQA, MQA), head_dim (may differ from
//               width / heads), bias on q/k/v and on the output apart, QK-norm (an RMSNorm over
//               head_dim on queries and keys before RoPE, Qwen3's), a sliding window per layer
//   head        tied to the token embedding or its own lm_head (the heads, causal_lm.h and
//               sequence_classifier.h, read it; the backbone does not own the head)
//   dropout     after the embeddings, on the attention probabilities, after each residual branch
//
// Parameters under Hugging Face's Llama names, relative to the backbone:
//   embed_tokens.weight            [vocab, hidden]
//   embed_positions.weight         [max_position_embeddings, hidden]   learned positions only
//   layers.<i>.input_layernorm.{weight,bias}
//   layers.<i>.self_attn.{q,k,v,o}_proj.{weight,bias}                 biases when configured
//   layers.<i>.self_attn.{q,k}_norm.weight                            QK-norm only
//   layers.<i>.post_attention_layernorm.{weight,bias}
//   layers.<i>.mlp.{gate,up,down}_proj.{weight,bias}                  gate for SwiGLU only
//   norm.{weight,bias}
// A head registers the backbone as `transformer`; the architecture table maps that prefix to
// the family's (HF's `model.`) in checkpoints.
//
// Attention is causal and sees only real keys (attention_mask), and a sliding window of W keeps
// the keys at most W - 1 positions back, as HF's sliding_window_overlay. RoPE's positions come
// from the mask (cumsum - 1, as HF's generate passes them), so left, right and no padding give a
// real token the same logits. Grouped-query attention runs through libtorch's
// scaled_dot_product_attention with enable_gqa (no repeated keys or values); with dropout on the
// probabilities (training with attention_dropout > 0) it runs as two matmuls with each key-value
// head's query heads folded into its rows, which repeats nothing either.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gradaccum/models/decoder.h"
#include "gradaccum/models/rope.h"
#include "gradaccum/models/sample_dropout.h"

namespace gradaccum::models {

enum class PositionKind { learned, alibi, rope };
enum class DecoderNorm { layer_norm, rms_norm };
enum class MlpKind { gelu_tanh, swiglu };

struct TransformerOptions {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // 0: num_heads (multi-head); 1: multi-query
  int64_t head_dim = 0;      // 0: hidden_size / num_heads
  int64_t intermediate_size = 0;
  // The longest sequence accepted: learned positions' table, RoPE's context (where dynamic
  // scaling equals the default). ALiBi accepts any length.
  int64_t max_position_embeddings = 0;
  PositionKind positions = PositionKind::rope;
  RopeOptions rope;
  DecoderNorm norm = DecoderNorm::rms_norm;
  double norm_eps = 1e-6;
  bool norm_bias = false;  // LayerNorm's bias (RMSNorm has none)
  MlpKind mlp = MlpKind::swiglu;
  bool mlp_bias = false;
  bool qkv_bias = false;
  bool o_bias = false;
  bool qk_norm = false;
  // Per layer, the sliding window (0: full causal attention); empty: every layer full.
  std::vector<int64_t> sliding_windows;
  bool tie_word_embeddings = true;
  double embedding_dropout = 0.0;
  double attention_dropout = 0.0;
  double residual_dropout = 0.0;
  DropoutRng dropout_rng = DropoutRng::per_sample;
  double initializer_range = 0.02;
  uint64_t init_seed = 0;  // the initialization's own generator

  int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  int64_t dim_per_head() const { return head_dim > 0 ? head_dim : (num_heads > 0 ? hidden_size / num_heads : 0); }
  int64_t window(int64_t layer) const {
    return sliding_windows.empty() ? 0 : sliding_windows[static_cast<size_t>(layer)];
  }
};

// Throws gradaccum::Error naming `what` and the option when `options` cannot make a decoder.
void check_transformer_options(const TransformerOptions& options, const std::string& what);

// LayerNorm or RMSNorm over the last dimension. RMSNorm: x / √(mean(x²) + eps) · weight, computed
// in float32 for 16-bit inputs (as HF) and in the input's dtype otherwise.
class TransformerNormImpl : public torch::nn::Module {
 public:
  TransformerNormImpl(DecoderNorm kind, int64_t size, double eps, bool bias);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight, bias;

 private:
  DecoderNorm kind_;
  int64_t size_;
  double eps_;
};
TORCH_MODULE(TransformerNorm);

// What one layer's attention may see: `allowed` [B or 1, 1, T, T] bool, and `bias`, the additive
// mask in the scores' dtype (0 or ALiBi where allowed, the dtype's lowest value elsewhere) of
// shape [B or 1, 1 or H, T, T].
struct AttentionMask {
  torch::Tensor allowed, bias;
};

class TransformerAttentionImpl : public torch::nn::Module {
 public:
  TransformerAttentionImpl(const TransformerOptions& options, int64_t layer);
  // x [B, T, C]; cos, sin [B, T, head_dim] (RoPE) or undefined.
  torch::Tensor forward(const torch::Tensor& x, const AttentionMask& mask, const torch::Tensor& cos,
                        const torch::Tensor& sin);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  TransformerNorm q_norm{nullptr}, k_norm{nullptr};  // QK-norm only
  SampleDropout attn_dropout{nullptr};               // on the probabilities
  SampleDropout resid_dropout{nullptr};              // on the output

 private:
  int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(TransformerAttention);

class TransformerMlpImpl : public torch::nn::Module {
 public:
  TransformerMlpImpl(const TransformerOptions& options, int64_t layer);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear gate_proj{nullptr};  // SwiGLU only
  torch::nn::Linear up_proj{nullptr}, down_proj{nullptr};
  SampleDropout dropout{nullptr};

 private:
  MlpKind kind_;
};
TORCH_MODULE(TransformerMlp);

// x + attn(input_layernorm(x)), then + mlp(post_attention_layernorm(·)).
class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(const TransformerOptions& options, int64_t layer);
  torch::Tensor forward(const torch::Tensor& x, const AttentionMask& mask, const torch::Tensor& cos,
                        const torch::Tensor& sin);

  TransformerNorm input_layernorm{nullptr};
  TransformerAttention self_attn{nullptr};
  TransformerNorm post_attention_layernorm{nullptr};
  TransformerMlp mlp{nullptr};
};
TORCH_MODULE(TransformerBlock);

// The backbone: embeddings, blocks, final norm → hidden states [B, T, hidden_size]. Initialized
// in its constructor (weights N(0, initializer_range), norms' weights 1, biases 0, drawn from a
// generator seeded with init_seed in registration order).
class TransformerDecoderImpl : public DecoderImpl {
 public:
  // `what` names the configuration in errors.
  explicit TransformerDecoderImpl(const TransformerOptions& options, const std::string& what = "decoder");
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {});

  torch::Tensor hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                              const TokenEmbeddingGrad& embedding_grad = TokenEmbeddingGrad::dense()) override;
  torch::Tensor token_embedding() override { return embed_tokens->weight; }
  int64_t hidden_size() const override { return options_.hidden_size; }
  int64_t vocab_size() const override { return options_.vocab_size; }
  int64_t max_positions() const override {
    return options_.positions == PositionKind::alibi ? 0 : options_.max_position_embeddings;
  }
  const TransformerOptions& options() const { return options_; }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::Embedding embed_positions{nullptr};  // learned positions only
  SampleDropout embed_dropout{nullptr};
  torch::nn::ModuleList layers{nullptr};
  TransformerNorm norm{nullptr};

 protected:
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() const override { return layers->children(); }

 private:
  TransformerOptions options_;
  RopeFrequencies rope_;
};
TORCH_MODULE(TransformerDecoder);

}  // namespace gradaccum::models
