#include "gradaccum/models/bloom.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <memory>
#include <string>

#include "gradaccum/base/check.h"
#include "gradaccum/kernels/gelu_tanh.h"
#include "gradaccum/kernels/masked_softmax.h"
#include "gradaccum/kernels/qkv_attention.h"
#include "gradaccum/models/linear.h"

namespace gradaccum::models {

namespace {
torch::nn::LayerNorm layer_norm(const BloomConfig& config) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.hidden_size}).eps(config.layer_norm_epsilon));
}

bool name_ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// HF's BloomPreTrainedModel._init_weights (no depth-scaled residual
// projections, unlike GPT-2). Names are relative to the BloomModel.
void init_weights(torch::nn::Module& model, const BloomConfig& config) {
  torch::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(config.init_seed);
  for (auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    auto& p = item.value();
    const bool layer_norm = name.find("layernorm.") != std::string::npos || name.rfind("ln_f.", 0) == 0;
    if (layer_norm && name_ends_with(name, ".weight"))
      p.fill_(1.0);
    else if (name_ends_with(name, ".bias"))
      p.zero_();
    else
      p.normal_(0.0, config.initializer_range, generator);
  }
}
}  // namespace

torch::Tensor bloom_alibi_slopes(int64_t n_head) {
  GA_CHECK(n_head > 0, "BLOOM: n_head must be positive, got {}", n_head);
  int64_t p = 1;  // the largest power of two <= n_head
  while (2 * p <= n_head) p *= 2;
  const double log2_p = std::log2(static_cast<double>(p));
  const double base = std::pow(2.0, -std::pow(2.0, -(log2_p - 3.0)));
  const double extra_base = std::pow(2.0, -std::pow(2.0, -(log2_p + 1.0 - 3.0)));
  auto slopes = torch::empty({n_head}, torch::kDouble);
  auto s = slopes.accessor<double, 1>();
  for (int64_t i = 0; i < p; ++i) s[i] = std::pow(base, static_cast<double>(i + 1));
  for (int64_t i = p; i < n_head; ++i) s[i] = std::pow(extra_base, static_cast<double>(2 * (i - p) + 1));
  return slopes;
}

torch::Tensor bloom_alibi(const torch::Tensor& attention_mask, int64_t time, int64_t n_head, torch::ScalarType dtype,
                          torch::Device device) {
  torch::Tensor positions;  // [B or 1, T] float64
  if (attention_mask.defined()) {
    auto mask = attention_mask.ne(0).to(torch::kDouble);
    positions = (mask.cumsum(-1) - 1) * mask;
  } else {
    positions = torch::arange(time, torch::TensorOptions().dtype(torch::kDouble).device(device)).unsqueeze(0);
  }
  auto slopes = bloom_alibi_slopes(n_head).to(positions.device());
  return (slopes.view({1, n_head, 1, 1}) * positions.unsqueeze(1).unsqueeze(1)).to(dtype);
}

torch::Tensor bloom_attention_bias(const torch::Tensor& alibi, const torch::Tensor& allowed,
                                   std::optional<torch::ScalarType> scores_dtype) {
  const double lowest = kernels::lowest_finite(scores_dtype.value_or(alibi.scalar_type()));
  return torch::where(allowed, alibi, torch::scalar_tensor(lowest, alibi.options()));
}

// Dropout sites per block i: 3i the attention probabilities, 3i + 1 the attention's output,
// 3i + 2 the MLP's output.
BloomAttentionImpl::BloomAttentionImpl(const BloomConfig& config, int64_t layer) : n_head_(config.n_head) {
  query_key_value = register_module("query_key_value", torch::nn::Linear(config.hidden_size, 3 * config.hidden_size));
  dense = register_module("dense", torch::nn::Linear(config.hidden_size, config.hidden_size));
  attention_dropout =
      register_module("attention_dropout", SampleDropout(config.attention_dropout, 3 * layer, config.dropout_rng));
  hidden_dropout =
      register_module("hidden_dropout", SampleDropout(config.hidden_dropout, 3 * layer + 1, config.dropout_rng));
}

torch::Tensor BloomAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& alibi,
                                          const torch::Tensor& allowed) {
  const int64_t batch = x.size(0), time = x.size(1), channels = x.size(2);
  // Per head: [q | k | v] of head_dim each, head after head.
  const auto qkv = linear(query_key_value, x);
  if (attention_dropout->p() == 0.0 || !is_training()) {
    // One node on the CPU (kernels/qkv_attention.h), libtorch's fused attention elsewhere.
    // Padding queries, which attend to nothing, get a uniform average and pass no gradient
    // back (in float16 through libtorch's attention an average weighted by their scores);
    // no real position and no loss reads them.
    const auto y = kernels::qkv_attention(qkv, n_head_, allowed, {kernels::QkvPacking::by_head, alibi});
    return hidden_dropout->forward(linear(dense, y));
  }
  // Dropout on the probabilities needs them as a tensor: HF's expression, alibi + q·kᵀ / √D
  // in its order (baddbmm with alpha = 1/√D), with the scores masked in their own dtype
  // (qkv's: 16 bits under 16-bit autocast).
  const int64_t head_dim = channels / n_head_;
  const auto fused = qkv.view({batch, time, n_head_, 3, head_dim});
  const auto q = fused.select(3, 0).transpose(1, 2);  // [B, H, T, D]
  const auto k = fused.select(3, 1).transpose(1, 2);
  const auto v = fused.select(3, 2).transpose(1, 2);
  const double inv_norm = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const auto bias = bloom_attention_bias(alibi, allowed, qkv.scalar_type());
  const auto scores = bias + torch::matmul(q, k.transpose(-2, -1)) * inv_norm;  // [B, H, T, T]
  const auto y = torch::matmul(attention_dropout->forward(kernels::masked_softmax(scores, allowed)), v);
  return hidden_dropout->forward(linear(dense, y.transpose(1, 2).reshape({batch, time, channels})));
}

namespace {

torch::Tensor bloom_gelu_value(const torch::Tensor& x) {
  return x * 0.5 * (1.0 + torch::tanh(0.79788456 * x * (1.0 + 0.044715 * x * x)));
}

// Saves the input only. Autograd on the expression kept six [T, 4C] intermediates of it per
// block: 38 MB a layer measured at up to 512 tokens, ~1 GB of BLOOM-560m's peak (BENCHMARKS.md).
struct BloomGeluFunction : torch::autograd::Function<BloomGeluFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    ctx->save_for_backward({x});
    return bloom_gelu_value(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto x = ctx->get_saved_variables()[0];
    // HF's bloom_gelu_back, term for term.
    const auto tanh_out = torch::tanh(0.79788456 * x * (1 + 0.044715 * x * x));
    const auto ff = 0.5 * x * ((1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + tanh_out);
    return {ff * grads[0]};
  }
};

}  // namespace

torch::Tensor bloom_gelu(const torch::Tensor& x) {
  if (kernels::gelu_tanh_fuses(x)) return kernels::gelu_tanh(x);
  return x.requires_grad() && torch::GradMode::is_enabled() ? BloomGeluFunction::apply(x) : bloom_gelu_value(x);
}

BloomMlpImpl::BloomMlpImpl(const BloomConfig& config, int64_t layer) {
  dense_h_to_4h = register_module("dense_h_to_4h", torch::nn::Linear(config.hidden_size, 4 * config.hidden_size));
  dense_4h_to_h = register_module("dense_4h_to_h", torch::nn::Linear(4 * config.hidden_size, config.hidden_size));
  hidden_dropout =
      register_module("hidden_dropout", SampleDropout(config.hidden_dropout, 3 * layer + 2, config.dropout_rng));
}

torch::Tensor BloomMlpImpl::forward(const torch::Tensor& x) {
  return hidden_dropout->forward(linear(dense_4h_to_h, bloom_gelu(linear(dense_h_to_4h, x))));
}

BloomBlockImpl::BloomBlockImpl(const BloomConfig& config, int64_t layer) {
  input_layernorm = register_module("input_layernorm", layer_norm(config));
  self_attention = register_module("self_attention", BloomAttention(config, layer));
  post_attention_layernorm = register_module("post_attention_layernorm", layer_norm(config));
  mlp = register_module("mlp", BloomMlp(config, layer));
}

torch::Tensor BloomBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& alibi,
                                      const torch::Tensor& allowed) {
  auto hidden = x + self_attention->forward(input_layernorm->forward(x), alibi, allowed);
  return hidden + mlp->forward(post_attention_layernorm->forward(hidden));
}

BloomModelImpl::BloomModelImpl(const BloomConfig& config) : config_(config) {
  GA_CHECK(config.vocab_size > 0 && config.hidden_size > 0 && config.n_head > 0 && config.n_layer >= 0,
           "BLOOM config: vocab_size {}, hidden_size {}, n_head {} must be positive and n_layer "
           "{} not negative",
           config.vocab_size, config.hidden_size, config.n_head, config.n_layer);
  GA_CHECK(config.hidden_size % config.n_head == 0, "BLOOM config: hidden_size {} is not divisible by n_head {}",
           config.hidden_size, config.n_head);
  word_embeddings = register_module("word_embeddings", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  word_embeddings_layernorm = register_module("word_embeddings_layernorm", layer_norm(config));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.n_layer; ++i) h->push_back(BloomBlock(config, i));
  ln_f = register_module("ln_f", layer_norm(config));
  init_weights(*this, config);
}

torch::Tensor BloomModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  return hidden_states(input_ids, attention_mask, TokenEmbeddingGrad::dense());
}

torch::Tensor BloomModelImpl::hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                            const TokenEmbeddingGrad& embedding_grad) {
  check_decoder_inputs("BLOOM", input_ids, attention_mask, config_.vocab_size, 0);
  auto x = word_embeddings_layernorm->forward(embedding_grad.lookup(word_embeddings->weight, input_ids));
  const auto allowed = causal_attention_allowed(input_ids, attention_mask);
  const auto alibi = bloom_alibi(attention_mask, input_ids.size(1), config_.n_head, x.scalar_type(), x.device());
  for (size_t i = 0; i < h->size(); ++i) {
    auto block = h->ptr<BloomBlockImpl>(i);
    x = run_block(static_cast<int64_t>(i), *block,
                  [block](const std::vector<torch::Tensor>& in) { return block->forward(in[0], in[1], in[2]); },
                  {x, alibi, allowed});
  }
  return ln_f->forward(x);
}

}  // namespace gradaccum::models
