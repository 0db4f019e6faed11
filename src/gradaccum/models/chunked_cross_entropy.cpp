#include "gradaccum/models/chunked_cross_entropy.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>

#include "gradaccum/core/check.h"
#include "gradaccum/models/causal_lm.h"

namespace gradaccum::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::string sizes_text(torch::IntArrayRef sizes) {
  return fmt::format("[{}]", fmt::join(sizes, ", "));
}

// The dtypes of one call, fixed at forward time: autocast is thread-local
// state, and backward() may run outside the autocast region (or on another
// thread), so the backward must not look it up again.
struct Precision {
  torch::ScalarType matmul;   // the chunk projections (autocast's dtype under autocast)
  torch::ScalarType softmax;  // log-sum-exp, softmax and the sums: float32 or float64
};

Precision precision_of(const torch::Tensor& hidden, const torch::Tensor& weight) {
  const auto inputs = torch::promote_types(hidden.scalar_type(), weight.scalar_type());
  Precision p{inputs, inputs == torch::kDouble ? torch::kDouble : torch::kFloat};
  bool autocast = false;
  torch::ScalarType lower = inputs;
  if (hidden.is_cuda()) {
    autocast = at::autocast::is_enabled();
    lower = at::autocast::get_autocast_gpu_dtype();
  } else if (hidden.is_cpu()) {
    autocast = at::autocast::is_cpu_enabled();
    lower = at::autocast::get_autocast_cpu_dtype();
  }
  // Autocast lowers float16/bfloat16/float32 matmuls and leaves float64 alone.
  if (autocast && inputs != torch::kDouble) p.matmul = lower;
  return p;
}

// Logits of the target positions `rows` of hidden_flat [B·T, H]: [rows, V] in
// the softmax dtype, the matmul done in the matmul dtype.
torch::Tensor chunk_logits(const torch::Tensor& hidden_flat, const torch::Tensor& weight_mm,
                           const torch::Tensor& rows, const Precision& p,
                           torch::Tensor* hidden_chunk_out = nullptr) {
  auto h = hidden_flat.index_select(0, rows).to(p.matmul);
  auto logits = h.matmul(weight_mm.t()).to(p.softmax);
  if (hidden_chunk_out != nullptr) *hidden_chunk_out = std::move(h);
  return logits;
}

// Sum of cross-entropies of the target positions. Inputs: hidden [B, T, H],
// weight [V, H], positions [N] (flat row indices into hidden viewed as
// [B·T, H]), targets [N] (class ids in [0, V)). Saves hidden, weight, the
// positions, targets and the per-position log-sum-exp [N]: nothing of size V
// beyond weight itself.
class ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& positions,
                               const torch::Tensor& targets, int64_t chunk_tokens) {
    const Precision p = precision_of(hidden, weight);
    // The dtypes are explicit below; autocast must not re-cast them.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto hidden_flat = hidden.reshape({-1, hidden.size(-1)});
    const auto weight_mm = weight.to(p.matmul);
    const int64_t n = positions.size(0);
    auto lse = torch::empty({n}, hidden.options().dtype(p.softmax));
    auto total = torch::zeros({}, hidden.options().dtype(p.softmax));
    for (int64_t begin = 0; begin < n; begin += chunk_tokens) {
      const int64_t end = std::min(n, begin + chunk_tokens);
      auto logits = chunk_logits(hidden_flat, weight_mm, positions.slice(0, begin, end), p);
      // -log softmax(logits)[target] = logsumexp(logits) - logits[target].
      auto chunk_lse = logits.logsumexp(1);
      auto target_logits = logits.gather(1, targets.slice(0, begin, end).unsqueeze(1)).squeeze(1);
      total.add_((chunk_lse - target_logits).sum());
      lse.slice(0, begin, end).copy_(chunk_lse);
    }
    ctx->save_for_backward({hidden, weight});
    ctx->saved_data["positions"] = positions;
    ctx->saved_data["targets"] = targets;
    ctx->saved_data["lse"] = lse;
    ctx->saved_data["chunk_tokens"] = chunk_tokens;
    ctx->saved_data["matmul_dtype"] = static_cast<int64_t>(p.matmul);
    ctx->saved_data["softmax_dtype"] = static_cast<int64_t>(p.softmax);
    return total;
  }

  // d sum / d logits[i] = softmax(logits[i]) - onehot(target[i]), times the
  // incoming gradient; logits = h · weightᵀ gives d h = g · weight and
  // d weight = Σ chunks gᵀ · h, accumulated in the softmax dtype.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& hidden = saved[0];
    const auto& weight = saved[1];
    const auto positions = ctx->saved_data["positions"].toTensor();
    const auto targets = ctx->saved_data["targets"].toTensor();
    const auto lse = ctx->saved_data["lse"].toTensor();
    const int64_t chunk_tokens = ctx->saved_data["chunk_tokens"].toInt();
    const Precision p{static_cast<torch::ScalarType>(ctx->saved_data["matmul_dtype"].toInt()),
                      static_cast<torch::ScalarType>(ctx->saved_data["softmax_dtype"].toInt())};
    const bool need_hidden = ctx->needs_input_grad(0);
    const bool need_weight = ctx->needs_input_grad(1);

    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto grad_sum = grad_outputs[0].to(p.softmax);
    const auto hidden_flat = hidden.reshape({-1, hidden.size(-1)});
    const auto weight_mm = weight.to(p.matmul);
    torch::Tensor grad_hidden_flat, grad_weight;
    if (need_hidden) grad_hidden_flat = torch::zeros_like(hidden_flat);
    if (need_weight) grad_weight = torch::zeros(weight.sizes(), weight.options().dtype(p.softmax));

    const int64_t n = positions.size(0);
    for (int64_t begin = 0; begin < n && (need_hidden || need_weight); begin += chunk_tokens) {
      const int64_t end = std::min(n, begin + chunk_tokens);
      const auto rows = positions.slice(0, begin, end);
      torch::Tensor h;
      auto grad_logits = chunk_logits(hidden_flat, weight_mm, rows, p, &h);
      grad_logits.sub_(lse.slice(0, begin, end).unsqueeze(1)).exp_();  // softmax
      const auto target = targets.slice(0, begin, end).unsqueeze(1);
      grad_logits.scatter_(1, target, grad_logits.gather(1, target) - 1);
      grad_logits.mul_(grad_sum);
      const auto grad_mm = grad_logits.to(p.matmul);
      grad_logits = torch::Tensor();  // free the softmax-dtype chunk before the next allocations
      if (need_hidden) {
        grad_hidden_flat.index_copy_(0, rows, grad_mm.matmul(weight_mm).to(hidden.scalar_type()));
      }
      if (need_weight) {
        if (p.matmul == p.softmax) {
          grad_weight.addmm_(grad_mm.t(), h);
        } else {
          grad_weight.add_(grad_mm.t().matmul(h));
        }
      }
    }
    torch::Tensor grad_hidden;
    if (need_hidden) grad_hidden = grad_hidden_flat.view(hidden.sizes());
    if (need_weight) grad_weight = grad_weight.to(weight.scalar_type());
    return {grad_hidden, grad_weight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

core::LossSum chunked_causal_lm_loss(const torch::Tensor& hidden, const torch::Tensor& weight,
                                     const torch::Tensor& labels, int64_t chunk_tokens) {
  GA_CHECK(chunk_tokens > 0, "chunked cross-entropy: chunk_tokens must be positive, got {}",
           chunk_tokens);
  GA_CHECK(hidden.defined() && weight.defined() && labels.defined(),
           "chunked cross-entropy: hidden, weight and labels must all be defined");
  GA_CHECK(
      hidden.dim() == 3 && labels.dim() == 2 && hidden.size(0) == labels.size(0) &&
          hidden.size(1) == labels.size(1),
      "chunked cross-entropy: hidden states {} do not match labels {} (want [B, T, H], [B, T])",
      sizes_text(hidden.sizes()), sizes_text(labels.sizes()));
  GA_CHECK(weight.dim() == 2 && weight.size(1) == hidden.size(2),
           "chunked cross-entropy: weight {} does not match hidden states {} (want [V, H])",
           sizes_text(weight.sizes()), sizes_text(hidden.sizes()));
  GA_CHECK(hidden.is_floating_point() && weight.is_floating_point(),
           "chunked cross-entropy: hidden states and weight must be floating point");
  GA_CHECK(labels.scalar_type() == torch::kLong || labels.scalar_type() == torch::kInt,
           "chunked cross-entropy: labels must be int64 or int32");

  const int64_t batch = labels.size(0);
  const int64_t time = labels.size(1);
  // The shift: position t is scored against labels[:, t + 1]; the last
  // position of each row has no label (kIgnoreIndex).
  auto next = torch::full({batch, time}, kIgnoreIndex, labels.options().dtype(torch::kLong));
  if (time > 1) next.slice(1, 0, time - 1).copy_(labels.slice(1, 1, time));
  next = next.reshape({-1});
  // Keep only the scored positions: padding and ignored labels cost nothing.
  const auto positions = next.ne(kIgnoreIndex).nonzero().reshape({-1});
  const auto targets = next.index_select(0, positions);
  const int64_t vocab = weight.size(0);
  if (targets.is_cpu() && targets.numel() > 0) {
    const auto bad = targets.lt(0).logical_or(targets.ge(vocab));
    if (bad.any().item<bool>()) {
      throw Error(fmt::format("chunked cross-entropy: label {} is outside the vocabulary [0, {})",
                              targets.masked_select(bad)[0].item<int64_t>(), vocab));
    }
  }
  auto sum = ChunkedCrossEntropy::apply(hidden, weight, positions.to(hidden.device()),
                                        targets.to(hidden.device()), chunk_tokens);
  auto count = torch::scalar_tensor(positions.size(0), labels.options().dtype(torch::kLong));
  return {sum, count};
}

}  // namespace gradaccum::models
