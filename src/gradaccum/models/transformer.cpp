#include "gradaccum/models/transformer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>

#include <cmath>
#include <map>
#include <memory>
#include <set>

#include "gradaccum/base/check.h"
#include "gradaccum/kernels/gelu_tanh.h"
#include "gradaccum/kernels/masked_softmax.h"
#include "gradaccum/models/bloom.h"
#include "gradaccum/models/linear.h"

namespace gradaccum::models {

namespace {

torch::nn::Linear make_linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

torch::Tensor apply_linear(const torch::nn::Linear& layer, const torch::Tensor& x) { return linear(layer, x); }

// Weights N(0, initializer_range) in registration order from the decoder's own generator,
// biases 0, the norms' weights 1 (as HF's _init_weights for these families).
void init_weights(torch::nn::Module& model, const TransformerOptions& options) {
  torch::NoGradGuard no_grad;
  std::set<const void*> norm_weights;
  for (const auto& m : model.modules(/*include_self=*/false)) {
    if (auto norm = std::dynamic_pointer_cast<TransformerNormImpl>(m)) norm_weights.insert(norm->weight.data_ptr());
  }
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.init_seed);
  for (auto& item : model.named_parameters()) {
    auto& p = item.value();
    const std::string& name = item.key();
    if (norm_weights.count(p.data_ptr()) > 0) {
      p.fill_(1.0);
    } else if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.zero_();
    } else {
      p.normal_(0.0, options.initializer_range, generator);
    }
  }
}

// The additive form of `allowed` in `dtype`: `alibi` ([B or 1, H, 1, T]) or 0 where allowed, the
// dtype's lowest value elsewhere.
torch::Tensor additive_mask(const torch::Tensor& allowed, const torch::Tensor& alibi, torch::ScalarType dtype) {
  const auto lowest = torch::scalar_tensor(kernels::lowest_finite(dtype), allowed.options().dtype(dtype));
  if (alibi.defined()) return torch::where(allowed, alibi.to(dtype), lowest);
  return torch::zeros(allowed.sizes(), allowed.options().dtype(dtype)).masked_fill_(allowed.logical_not(), lowest);
}

// Keys at most window - 1 positions before the query (HF's sliding_window_overlay: key > query -
// window). [1, 1, T, T] bool.
torch::Tensor within_window(int64_t time, int64_t window, const torch::Device& device) {
  const auto index = torch::arange(time, torch::TensorOptions().dtype(torch::kLong).device(device));
  const auto distance = index.view({time, 1}) - index.view({1, time});  // query - key
  return distance.lt(window).view({1, 1, time, time});
}

}  // namespace

void check_transformer_options(const TransformerOptions& o, const std::string& what) {
  GA_CHECK(o.vocab_size > 0 && o.hidden_size > 0 && o.num_heads > 0 && o.intermediate_size > 0 && o.num_layers >= 0,
           "{}: vocab_size {}, hidden_size {}, num_attention_heads {} and intermediate_size {} must be positive and "
           "num_hidden_layers {} not negative",
           what, o.vocab_size, o.hidden_size, o.num_heads, o.intermediate_size, o.num_layers);
  GA_CHECK(o.kv_heads() > 0 && o.num_heads % o.kv_heads() == 0,
           "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", what, o.num_heads, o.kv_heads());
  GA_CHECK(o.head_dim > 0 || o.hidden_size % o.num_heads == 0,
           "{}: hidden_size {} is not divisible by num_attention_heads {} (and no head_dim is given)", what,
           o.hidden_size, o.num_heads);
  GA_CHECK(o.positions != PositionKind::rope || o.dim_per_head() % 2 == 0,
           "{}: head_dim {} must be even for rotary positions", what, o.dim_per_head());
  GA_CHECK(o.positions == PositionKind::alibi || o.max_position_embeddings > 0,
           "{}: max_position_embeddings must be positive, got {}", what, o.max_position_embeddings);
  GA_CHECK(o.norm_eps > 0, "{}: the norm's eps must be positive, got {}", what, o.norm_eps);
  GA_CHECK(o.sliding_windows.empty() || static_cast<int64_t>(o.sliding_windows.size()) == o.num_layers,
           "{}: {} sliding windows for {} layers", what, o.sliding_windows.size(), o.num_layers);
  for (const auto w : o.sliding_windows) {
    GA_CHECK(w >= 0, "{}: a sliding window must be positive (or 0 for none), got {}", what, w);
  }
  check_dropout_probability("embedding dropout", o.embedding_dropout);
  check_dropout_probability("attention_dropout", o.attention_dropout);
  check_dropout_probability("residual dropout", o.residual_dropout);
}

TransformerNormImpl::TransformerNormImpl(DecoderNorm kind, int64_t size, double eps, bool bias)
    : kind_(kind), size_(size), eps_(eps) {
  weight = register_parameter("weight", torch::ones({size}));
  if (bias && kind == DecoderNorm::layer_norm) this->bias = register_parameter("bias", torch::zeros({size}));
}

torch::Tensor TransformerNormImpl::forward(const torch::Tensor& x) {
  if (kind_ == DecoderNorm::layer_norm) return torch::layer_norm(x, {size_}, weight, bias, eps_);
  // HF's RMSNorm: the statistics in float32 for 16-bit activations, then back to their dtype
  // before the gain.
  const bool low_precision = x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kHalf;
  const auto h = low_precision ? x.to(torch::kFloat) : x;
  const auto normed = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * normed.to(x.scalar_type());
}

// Dropout sites: 0 the embeddings, then per layer i: 3i + 1 the attention probabilities, 3i + 2
// the attention's output, 3i + 3 the MLP's output.
TransformerAttentionImpl::TransformerAttentionImpl(const TransformerOptions& o, int64_t layer)
    : heads_(o.num_heads), kv_heads_(o.kv_heads()), head_dim_(o.dim_per_head()) {
  q_proj = register_module("q_proj", make_linear(o.hidden_size, heads_ * head_dim_, o.qkv_bias));
  k_proj = register_module("k_proj", make_linear(o.hidden_size, kv_heads_ * head_dim_, o.qkv_bias));
  v_proj = register_module("v_proj", make_linear(o.hidden_size, kv_heads_ * head_dim_, o.qkv_bias));
  o_proj = register_module("o_proj", make_linear(heads_ * head_dim_, o.hidden_size, o.o_bias));
  if (o.qk_norm) {
    q_norm = register_module("q_norm", TransformerNorm(DecoderNorm::rms_norm, head_dim_, o.norm_eps, false));
    k_norm = register_module("k_norm", TransformerNorm(DecoderNorm::rms_norm, head_dim_, o.norm_eps, false));
  }
  attn_dropout = register_module("attn_dropout", SampleDropout(o.attention_dropout, 3 * layer + 1, o.dropout_rng));
  resid_dropout = register_module("resid_dropout", SampleDropout(o.residual_dropout, 3 * layer + 2, o.dropout_rng));
}

torch::Tensor TransformerAttentionImpl::forward(const torch::Tensor& x, const AttentionMask& mask,
                                                const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t batch = x.size(0), time = x.size(1);
  auto q = apply_linear(q_proj, x).view({batch, time, heads_, head_dim_});
  auto k = apply_linear(k_proj, x).view({batch, time, kv_heads_, head_dim_});
  auto v = apply_linear(v_proj, x).view({batch, time, kv_heads_, head_dim_}).transpose(1, 2);
  if (!q_norm.is_empty()) {
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  q = q.transpose(1, 2);  // [B, H, T, D]
  k = k.transpose(1, 2);  // [B, KV, T, D]
  if (cos.defined()) {
    // Under autocast the rotation promotes 16-bit projections to cos's float32: back to v's dtype,
    // the one the attention computes in.
    q = apply_rope(q, cos, sin).to(v.scalar_type());
    k = apply_rope(k, cos, sin).to(v.scalar_type());
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  torch::Tensor y;  // [B, H, T, D]
  if (attn_dropout->p() > 0.0 && is_training()) {
    // The probabilities as a tensor, for their dropout. Each key-value head's G query heads are
    // folded into its rows ([B, KV, G·T, D]), so keys and values are used as they are.
    const int64_t groups = heads_ / kv_heads_;
    const auto folded = q.reshape({batch, kv_heads_, groups * time, head_dim_});
    const auto scores =
        torch::matmul(folded, k.transpose(-2, -1)).view({batch, heads_, time, time}) * scale + mask.bias;
    const auto probs = attn_dropout->forward(kernels::masked_softmax(scores, mask.allowed)).to(v.scalar_type());
    y = torch::matmul(probs.reshape({batch, kv_heads_, groups * time, time}), v).view({batch, heads_, time, head_dim_});
  } else {
    y = at::scaled_dot_product_attention(q, k, v, mask.bias.to(q.scalar_type()), 0.0, false, scale,
                                         /*enable_gqa=*/kv_heads_ != heads_);
  }
  return resid_dropout->forward(apply_linear(o_proj, y.transpose(1, 2).reshape({batch, time, heads_ * head_dim_})));
}

TransformerMlpImpl::TransformerMlpImpl(const TransformerOptions& o, int64_t layer) : kind_(o.mlp) {
  if (kind_ == MlpKind::swiglu)
    gate_proj = register_module("gate_proj", make_linear(o.hidden_size, o.intermediate_size, o.mlp_bias));
  up_proj = register_module("up_proj", make_linear(o.hidden_size, o.intermediate_size, o.mlp_bias));
  down_proj = register_module("down_proj", make_linear(o.intermediate_size, o.hidden_size, o.mlp_bias));
  dropout = register_module("dropout", SampleDropout(o.residual_dropout, 3 * layer + 3, o.dropout_rng));
}

torch::Tensor TransformerMlpImpl::forward(const torch::Tensor& x) {
  const auto inner = kind_ == MlpKind::swiglu ? torch::silu(apply_linear(gate_proj, x)) * apply_linear(up_proj, x)
                                              : kernels::gelu_tanh(apply_linear(up_proj, x));
  return dropout->forward(apply_linear(down_proj, inner));
}

TransformerBlockImpl::TransformerBlockImpl(const TransformerOptions& o, int64_t layer) {
  input_layernorm = register_module("input_layernorm", TransformerNorm(o.norm, o.hidden_size, o.norm_eps, o.norm_bias));
  self_attn = register_module("self_attn", TransformerAttention(o, layer));
  post_attention_layernorm =
      register_module("post_attention_layernorm", TransformerNorm(o.norm, o.hidden_size, o.norm_eps, o.norm_bias));
  mlp = register_module("mlp", TransformerMlp(o, layer));
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x, const AttentionMask& mask, const torch::Tensor& cos,
                                            const torch::Tensor& sin) {
  const auto hidden = x + self_attn->forward(input_layernorm->forward(x), mask, cos, sin);
  return hidden + mlp->forward(post_attention_layernorm->forward(hidden));
}

TransformerDecoderImpl::TransformerDecoderImpl(const TransformerOptions& options, const std::string& what)
    : options_(options) {
  check_transformer_options(options, what);
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(options.vocab_size, options.hidden_size));
  if (options.positions == PositionKind::learned) {
    embed_positions =
        register_module("embed_positions", torch::nn::Embedding(options.max_position_embeddings, options.hidden_size));
  }
  embed_dropout = register_module("embed_dropout", SampleDropout(options.embedding_dropout, 0, options.dropout_rng));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < options.num_layers; ++i) layers->push_back(TransformerBlock(options, i));
  norm =
      register_module("norm", TransformerNorm(options.norm, options.hidden_size, options.norm_eps, options.norm_bias));
  if (options.positions == PositionKind::rope) {
    // Sequences never exceed max_position_embeddings (max_positions()), so dynamic scaling's
    // frequencies are those of that length: fixed, and the same for every micro-batch.
    rope_ = rope_frequencies(options.rope, options.dim_per_head(), options.max_position_embeddings,
                             options.max_position_embeddings);
  }
  init_weights(*this, options);
}

torch::Tensor TransformerDecoderImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  return hidden_states(input_ids, attention_mask, TokenEmbeddingGrad::dense());
}

torch::Tensor TransformerDecoderImpl::hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                                    const TokenEmbeddingGrad& embedding_grad) {
  check_decoder_inputs("decoder", input_ids, attention_mask, options_.vocab_size, max_positions());
  const int64_t time = input_ids.size(1);
  const auto device = input_ids.device();
  const auto positions =
      attention_mask.defined()
          ? position_ids_from_mask(attention_mask)
          : torch::arange(time, torch::TensorOptions().dtype(torch::kLong).device(device)).unsqueeze(0);
  auto x = embedding_grad.lookup(embed_tokens->weight, input_ids);
  if (!embed_positions.is_empty()) x = x + embed_positions->forward(positions);
  x = embed_dropout->forward(x);

  torch::Tensor cos, sin;
  if (options_.positions == PositionKind::rope) std::tie(cos, sin) = rope_cos_sin(rope_, positions, x.scalar_type());
  torch::Tensor alibi;
  if (options_.positions == PositionKind::alibi) {
    alibi = bloom_alibi(attention_mask, time, options_.num_heads, torch::kDouble, device);
  }
  // The scores' dtype: the projections' output (16 bits under autocast).
  const auto scores_dtype = x.scalar_type() == torch::kFloat && at::autocast::is_autocast_enabled(device.type())
                                ? at::autocast::get_autocast_dtype(device.type())
                                : x.scalar_type();
  // One mask per distinct window, shared by the layers that use it.
  const auto causal = causal_attention_allowed(input_ids, attention_mask);
  std::map<int64_t, AttentionMask> masks;
  for (int64_t i = 0; i < options_.num_layers; ++i) {
    const int64_t window = options_.window(i);
    if (masks.count(window) > 0) continue;
    AttentionMask m;
    m.allowed = window > 0 && window < time ? causal.logical_and(within_window(time, window, device)) : causal;
    m.bias = additive_mask(m.allowed, alibi, scores_dtype);
    masks.emplace(window, m);
  }

  for (int64_t i = 0; i < options_.num_layers; ++i) {
    auto block = layers->ptr<TransformerBlockImpl>(static_cast<size_t>(i));
    const auto& mask = masks.at(options_.window(i));
    x = run_block(
        i, *block,
        [block, mask, cos, sin](const std::vector<torch::Tensor>& in) { return block->forward(in[0], mask, cos, sin); },
        {x});
  }
  return norm->forward(x);
}

}  // namespace gradaccum::models
