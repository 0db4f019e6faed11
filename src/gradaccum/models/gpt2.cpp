#include "gradaccum/models/gpt2.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <memory>
#include <string>

#include "gradaccum/base/check.h"
#include "gradaccum/kernels/gelu_tanh.h"
#include "gradaccum/kernels/qkv_attention.h"
#include "gradaccum/models/linear.h"

namespace gradaccum::models {

namespace {
torch::nn::LayerNorm layer_norm(const Gpt2Config& config) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd}).eps(config.layer_norm_epsilon));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// HF's GPT2PreTrainedModel._init_weights: weights N(0, initializer_range),
// biases 0, LayerNorm (1, 0); the residual projections (c_proj) N(0,
// initializer_range / sqrt(2 n_layer)) so the residual stream's variance does
// not grow with depth. Drawn from a generator of our own in registration order.
// `model` is the Gpt2Model itself: names are relative to it (ln_f.weight,
// h.0.ln_1.weight), and the draws the same as from a head around it.
void init_weights(torch::nn::Module& model, const Gpt2Config& config) {
  torch::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(config.init_seed);
  const double std = config.initializer_range;
  const double residual_std = std / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    auto& p = item.value();
    if (name.rfind("ln_", 0) == 0 || name.find(".ln_") != std::string::npos) {
      if (ends_with(name, ".weight"))
        p.fill_(1.0);
      else
        p.zero_();
    } else if (ends_with(name, ".bias")) {
      p.zero_();
    } else {
      p.normal_(0.0, ends_with(name, "c_proj.weight") ? residual_std : std, generator);
    }
  }
}
}  // namespace

torch::Tensor gpt2_position_ids(const torch::Tensor& attention_mask) { return position_ids_from_mask(attention_mask); }

// Dropout sites: 0 the embeddings, then per block 3i + 1 the attention probabilities, 3i + 2 the
// attention's output, 3i + 3 the MLP's output.
Gpt2AttentionImpl::Gpt2AttentionImpl(const Gpt2Config& config, int64_t layer) : n_head_(config.n_head) {
  c_attn = register_module("c_attn", torch::nn::Linear(config.n_embd, 3 * config.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(config.n_embd, config.n_embd));
  attn_dropout = register_module("attn_dropout", SampleDropout(config.attn_pdrop, 3 * layer + 1, config.dropout_rng));
  resid_dropout =
      register_module("resid_dropout", SampleDropout(config.resid_pdrop, 3 * layer + 2, config.dropout_rng));
}

torch::Tensor Gpt2AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& allowed) {
  const auto qkv = linear(c_attn, x);
  // Dropout on the probabilities needs them as a tensor: the libtorch expression then.
  const auto y = attn_dropout->p() > 0.0 && is_training()
                     ? kernels::qkv_attention_transformed(
                           qkv, n_head_, allowed, [this](const torch::Tensor& p) { return attn_dropout->forward(p); })
                     : kernels::qkv_attention(qkv, n_head_, allowed);
  return resid_dropout->forward(linear(c_proj, y));
}

Gpt2MlpImpl::Gpt2MlpImpl(const Gpt2Config& config, int64_t layer) {
  c_fc = register_module("c_fc", torch::nn::Linear(config.n_embd, 4 * config.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * config.n_embd, config.n_embd));
  dropout = register_module("dropout", SampleDropout(config.resid_pdrop, 3 * layer + 3, config.dropout_rng));
}

torch::Tensor Gpt2MlpImpl::forward(const torch::Tensor& x) {
  return dropout->forward(linear(c_proj, kernels::gelu_tanh(linear(c_fc, x))));
}

Gpt2BlockImpl::Gpt2BlockImpl(const Gpt2Config& config, int64_t layer) {
  ln_1 = register_module("ln_1", layer_norm(config));
  attn = register_module("attn", Gpt2Attention(config, layer));
  ln_2 = register_module("ln_2", layer_norm(config));
  mlp = register_module("mlp", Gpt2Mlp(config, layer));
}

torch::Tensor Gpt2BlockImpl::forward(const torch::Tensor& x, const torch::Tensor& allowed) {
  auto hidden = x + attn->forward(ln_1->forward(x), allowed);
  return hidden + mlp->forward(ln_2->forward(hidden));
}

Gpt2ModelImpl::Gpt2ModelImpl(const Gpt2Config& config) : config_(config) {
  GA_CHECK(
      config.vocab_size > 0 && config.n_positions > 0 && config.n_embd > 0 && config.n_layer >= 0 && config.n_head > 0,
      "GPT-2 config: vocab_size {}, n_positions {}, n_embd {}, n_head {} must be positive "
      "and n_layer {} not negative",
      config.vocab_size, config.n_positions, config.n_embd, config.n_head, config.n_layer);
  GA_CHECK(config.n_embd % config.n_head == 0, "GPT-2 config: n_embd {} is not divisible by n_head {}", config.n_embd,
           config.n_head);
  wte = register_module("wte", torch::nn::Embedding(config.vocab_size, config.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(config.n_positions, config.n_embd));
  drop = register_module("drop", SampleDropout(config.embd_pdrop, 0, config.dropout_rng));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.n_layer; ++i) h->push_back(Gpt2Block(config, i));
  ln_f = register_module("ln_f", layer_norm(config));
  init_weights(*this, config);
}

torch::Tensor Gpt2ModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  return hidden_states(input_ids, attention_mask, TokenEmbeddingGrad::dense());
}

torch::Tensor Gpt2ModelImpl::hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                           const TokenEmbeddingGrad& embedding_grad) {
  check_decoder_inputs("GPT-2", input_ids, attention_mask, config_.vocab_size, config_.n_positions);
  const int64_t time = input_ids.size(1);
  // [B or 1, 1, T, T]: query t may attend key s
  auto allowed = causal_attention_allowed(input_ids, attention_mask);
  // [B or 1, T]
  auto positions =
      attention_mask.defined()
          ? gpt2_position_ids(attention_mask)
          : torch::arange(time, torch::TensorOptions().dtype(torch::kLong).device(input_ids.device())).unsqueeze(0);
  auto x = drop->forward(embedding_grad.lookup(wte->weight, input_ids) + wpe->forward(positions));
  for (size_t i = 0; i < h->size(); ++i) {
    auto block = h->ptr<Gpt2BlockImpl>(i);
    x = run_block(static_cast<int64_t>(i), *block,
                  [block](const std::vector<torch::Tensor>& in) { return block->forward(in[0], in[1]); }, {x, allowed});
  }
  return ln_f->forward(x);
}

}  // namespace gradaccum::models
