// A GPT-2 decoder (Radford et al. 2019) in libtorch, structured like Hugging
// Face's modeling_gpt2 so that parameter names match theirs:
//
//   transformer.wte.weight                 token embedding [vocab, n_embd]
//   transformer.wpe.weight                 learned positions [n_positions, n_embd]
//   transformer.h.<i>.ln_1.{weight,bias}
//   transformer.h.<i>.attn.c_attn.{weight,bias}   fused q, k, v
//   transformer.h.<i>.attn.c_proj.{weight,bias}
//   transformer.h.<i>.ln_2.{weight,bias}
//   transformer.h.<i>.mlp.c_fc.{weight,bias}
//   transformer.h.<i>.mlp.c_proj.{weight,bias}
//   transformer.ln_f.{weight,bias}
//
// Gpt2Model is a Decoder (decoder.h); Gpt2LmHeadModel is the generic causal-LM
// head (causal_lm.h) on it, tied to transformer.wte (no parameter of its own, as
// HF's lm_head.weight is the same tensor as wte.weight), or with
// tie_word_embeddings false its own lm_head.weight [vocab, n_embd].
//
// Differences from HF: the projections are torch::nn::Linear, whose weight is
// [out, in]; HF's Conv1D stores [in, out]. A loader of HF checkpoints must
// transpose c_attn, c_proj and c_fc weights. Dropout at HF's places (the embeddings' sum,
// the attention probabilities, each residual branch's output), off by default and drawn per
// sample (sample_dropout.h) unless dropout_rng says libtorch.
//
// Padding: attention_mask (1 = real token, 0 = padding) is combined with the
// causal mask, and position ids are computed from it as HF's generate() does
// (position = number of real tokens before this one), so left padding, right
// padding and no padding give the real tokens the same positions and thus the
// same logits.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/decoder.h"
#include "gradaccum/models/sample_dropout.h"

namespace gradaccum::models {

// Field names as in HF's GPT2Config. The defaults are GPT-2 small's.
struct Gpt2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  // Seed of the initialization's own generator: equal configs give equal
  // weights, independent of the global RNG.
  uint64_t init_seed = 0;
  bool tie_word_embeddings = true;  // the LM head is wte (false: its own lm_head.weight)
  // Dropout probabilities (HF's names; 0 here, 0.1 in HF's GPT2Config): after the embeddings'
  // sum, after each residual branch, on the attention probabilities.
  double embd_pdrop = 0.0;
  double resid_pdrop = 0.0;
  double attn_pdrop = 0.0;
  DropoutRng dropout_rng = DropoutRng::per_sample;
};

// Causal multi-head self-attention with fused q, k, v projection.
class Gpt2AttentionImpl : public torch::nn::Module {
 public:
  // `layer`: the block's index (numbers its dropout sites).
  Gpt2AttentionImpl(const Gpt2Config& config, int64_t layer);
  // x [B, T, C]; allowed [B, 1, T, T] bool (causal ∧ key is a real token).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& allowed);

  torch::nn::Linear c_attn{nullptr};
  torch::nn::Linear c_proj{nullptr};
  SampleDropout attn_dropout{nullptr};   // on the probabilities
  SampleDropout resid_dropout{nullptr};  // on the output

 private:
  int64_t n_head_;
};
TORCH_MODULE(Gpt2Attention);

// Linear(C, 4C) → GELU (tanh approximation, HF's "gelu_new") → Linear(4C, C).
class Gpt2MlpImpl : public torch::nn::Module {
 public:
  Gpt2MlpImpl(const Gpt2Config& config, int64_t layer);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_fc{nullptr};
  torch::nn::Linear c_proj{nullptr};
  SampleDropout dropout{nullptr};
};
TORCH_MODULE(Gpt2Mlp);

// Pre-LayerNorm residual block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class Gpt2BlockImpl : public torch::nn::Module {
 public:
  Gpt2BlockImpl(const Gpt2Config& config, int64_t layer);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& allowed);

  torch::nn::LayerNorm ln_1{nullptr};
  Gpt2Attention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  Gpt2Mlp mlp{nullptr};
};
TORCH_MODULE(Gpt2Block);

// Embeddings, blocks and final LayerNorm: hidden states [B, T, n_embd].
// Initialized in its constructor (HF's _init_weights, from config.init_seed),
// so the backbone alone and every head on it start from the same weights.
class Gpt2ModelImpl : public DecoderImpl {
 public:
  explicit Gpt2ModelImpl(const Gpt2Config& config);
  // input_ids [B, T] int64; attention_mask [B, T] (any dtype, 1 = real token)
  // or undefined for no padding.
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {});

  torch::Tensor hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                              const TokenEmbeddingGrad& embedding_grad = TokenEmbeddingGrad::dense()) override;
  torch::Tensor token_embedding() override { return wte->weight; }
  int64_t hidden_size() const override { return config_.n_embd; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_positions() const override { return config_.n_positions; }
  const Gpt2Config& config() const { return config_; }

  torch::nn::Embedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};
  SampleDropout drop{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};

 protected:
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() const override { return h->children(); }

 private:
  Gpt2Config config_;
};
TORCH_MODULE(Gpt2Model);

// GPT2LMHeadModel: the generic causal-LM head on a Gpt2Model. forward(ids,
// mask) gives logits [B, T, vocab_size] (CausalLmHeadImpl); `transformer` is
// the backbone as a Decoder, gpt2() the same module with its GPT-2 fields.
class Gpt2LmHeadModelImpl : public CausalLmHeadImpl {
 public:
  explicit Gpt2LmHeadModelImpl(const Gpt2Config& config) : Gpt2LmHeadModelImpl(Gpt2Model(config)) {}
  const Gpt2Config& config() const { return gpt2_->config(); }
  Gpt2Model& gpt2() { return gpt2_; }

 private:
  explicit Gpt2LmHeadModelImpl(Gpt2Model gpt2)
      : CausalLmHeadImpl(as_decoder(gpt2), gpt2->config().tie_word_embeddings), gpt2_(gpt2) {}
  Gpt2Model gpt2_;  // the module registered as `transformer`, not registered twice
};
TORCH_MODULE(Gpt2LmHeadModel);

// HF's position ids for a padded batch: the number of real tokens before each
// position (cumsum(mask) - 1), with padding positions set to 1 as HF's generate()
// does (no real token attends to padding, so any valid index would do). [B, T] int64.
torch::Tensor gpt2_position_ids(const torch::Tensor& attention_mask);

}  // namespace gradaccum::models
