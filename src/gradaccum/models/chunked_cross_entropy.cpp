#include "gradaccum/models/chunked_cross_entropy.h"

#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>

#include "gradaccum/base/check.h"
#include "gradaccum/base/host_reads.h"
#include "gradaccum/kernels/float32_cpu_matmuls.h"
#include "gradaccum/kernels/softmax_cross_entropy.h"
#include "gradaccum/models/causal_lm.h"

namespace gradaccum::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::string sizes_text(torch::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

// The dtypes of one call, fixed at forward time: autocast is thread-local
// state, and backward() may run outside the autocast region (or on another
// thread), so the backward must not look it up again.
struct Precision {
  torch::ScalarType matmul;   // the chunk projections (autocast's dtype under autocast)
  torch::ScalarType softmax;  // log-sum-exp, softmax and the sums: float32 or float64
  // 16-bit projections computed as float32 GEMMs on 16-bit values, the result
  // rounded to 16 bits, as kernels/float32_cpu_matmuls.h routes autocast's own.
  bool float32_gemms = false;

  // A projection operand: in the matmul dtype, or its 16-bit values in float32.
  torch::Tensor operand(const torch::Tensor& t) const {
    return float32_gemms ? t.to(matmul).to(torch::kFloat) : t.to(matmul);
  }
  // A projection's result, as the matmul dtype's GEMM would return it.
  torch::Tensor result(const torch::Tensor& t) const { return float32_gemms ? t.to(matmul) : t; }
};

Precision precision_of(const torch::Tensor& hidden, const torch::Tensor& weight) {
  const auto inputs = torch::promote_types(hidden.scalar_type(), weight.scalar_type());
  Precision p{inputs, inputs == torch::kDouble ? torch::kDouble : torch::kFloat};
  bool autocast = false;
  torch::ScalarType lower = inputs;
  if (hidden.is_cuda() || hidden.is_cpu()) {
    autocast = at::autocast::is_autocast_enabled(hidden.device().type());
    lower = at::autocast::get_autocast_dtype(hidden.device().type());
  }
  // Autocast lowers float16/bfloat16/float32 matmuls and leaves float64 alone.
  if (autocast && inputs != torch::kDouble) p.matmul = lower;
  p.float32_gemms = hidden.is_cpu() && (p.matmul == torch::kBFloat16 || p.matmul == torch::kHalf) &&
                    kernels::cpu_autocast_matmuls_route_through_float32();
  return p;
}

// Sum of cross-entropies of the target positions, with its gradients
// computed in the forward. Inputs: hidden [B, T, H], weight [V, H], and either
//  - compact: positions [N] (flat row indices into hidden viewed as [B·T, H]),
//    targets [N] (class ids in [0, V)), valid unused; or
//  - masked: positions unused (every row of hidden), targets [B·T] (ignored
//    rows hold any id in [0, V)), valid [B·T] in the softmax dtype, 1 where
//    the row is scored and 0 where not.
// (Unused tensors are empty: autograd::Function rejects undefined inputs.)
//
// Why the gradients are computed in the forward: d sum / d logits =
// softmax(logits) - onehot(target) is known as soon as a chunk's logits are,
// so each chunk's logits are turned into their gradient in place and consumed
// by the two gradient matmuls while they are still in cache, and nothing of
// size V is kept or recomputed. The backward only scales the saved gradients
// of the sum by the incoming gradient (a scalar: the engine's 1 / window count,
// times the loss scale under fp16). What is saved: d sum / d hidden [B, T, H] in
// hidden's dtype and d sum / d weight [V, H] in the softmax dtype — one
// weight-sized buffer instead of hidden and weight themselves. Under no_grad,
// or when neither input requires a gradient, only the sum is computed.
// Moves a tensor out of ctx->saved_data (undefined when absent), leaving no reference behind.
torch::Tensor take_saved(AutogradContext* ctx, const std::string& key) {
  const auto it = ctx->saved_data.find(key);
  if (it == ctx->saved_data.end()) return {};
  auto tensor = std::move(it->second).toTensor();
  ctx->saved_data.erase(it);
  return tensor;
}

class ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& positions, const torch::Tensor& targets, const torch::Tensor& valid,
                               bool compact, int64_t chunk_tokens, bool need_hidden, bool need_weight,
                               const c10::intrusive_ptr<TiedTableGradient>& tied_table) {
    // Named in profiler traces: a custom Function's forward is not an operator.
    RECORD_FUNCTION("gradaccum::chunked_cross_entropy", std::vector<c10::IValue>());
    const Precision p = precision_of(hidden, weight);
    // The dtypes are explicit below; autocast must not re-cast them.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto hidden_flat = hidden.reshape({-1, hidden.size(-1)});
    const auto weight_mm = p.operand(weight);
    // The masked layout writes every row of d/d hidden; the compact one leaves the unscored
    // rows at zero. d/d weight starts as the first chunk's product (no zero fill of [V, H]).
    torch::Tensor grad_hidden_flat, grad_weight;
    if (need_hidden) {
      grad_hidden_flat = compact ? torch::zeros_like(hidden_flat) : torch::empty_like(hidden_flat);
    }

    // The loss and d sum / d logits = softmax - onehot(target) of each chunk
    // (kernels/softmax_cross_entropy.h: in place of the logits on the CPU).
    kernels::SoftmaxCrossEntropySum loss_sum(hidden.options().dtype(p.softmax));
    const int64_t n = targets.size(0);
    for (int64_t begin = 0; begin < n; begin += chunk_tokens) {
      const int64_t end = std::min(n, begin + chunk_tokens);
      const auto h = p.operand(compact ? hidden_flat.index_select(0, positions.slice(0, begin, end))
                                       : hidden_flat.slice(0, begin, end));
      auto logits = p.result(h.matmul(weight_mm.t()));
      const auto scored = compact ? torch::Tensor() : valid.slice(0, begin, end);
      auto grad_mm = loss_sum.add(logits, targets.slice(0, begin, end), scored, need_hidden || need_weight);
      if (!need_hidden && !need_weight) continue;
      if (p.float32_gemms) grad_mm = grad_mm.to(torch::kFloat);  // bfloat16 values, exactly
      if (need_hidden) {
        auto grad_h = p.result(grad_mm.matmul(weight_mm)).to(hidden.scalar_type());
        if (compact) {
          grad_hidden_flat.index_copy_(0, positions.slice(0, begin, end), grad_h);
        } else {
          grad_hidden_flat.slice(0, begin, end).copy_(grad_h);
        }
      }
      if (need_weight) {
        if (!grad_weight.defined()) {
          grad_weight = p.result(grad_mm.t().mm(h)).to(p.softmax);
        } else if (p.matmul == p.softmax) {
          grad_weight.addmm_(grad_mm.t(), h);
        } else {
          grad_weight.add_(p.result(grad_mm.t().mm(h)));
        }
      }
    }
    auto total = loss_sum.sum();
    if (need_weight && !grad_weight.defined()) {  // no scored position at all
      grad_weight = torch::zeros(weight.sizes(), weight.options().dtype(p.softmax));
    }
    // Kept in saved_data, not save_for_backward: the backward moves them out, so the
    // gradients it returns are their only references, which autograd may add into in place.
    ctx->saved_data["weight_dtype"] = weight.scalar_type();
    if (tied_table) ctx->saved_data["tied_table"] = c10::IValue::make_capsule(tied_table);
    if (need_hidden) ctx->saved_data["grad_hidden"] = grad_hidden_flat.view(hidden.sizes());
    if (need_weight) ctx->saved_data["grad_weight"] = std::move(grad_weight);
    return total;
  }

  // The chain rule with a scalar incoming gradient: scale the saved gradients,
  // in place — a copy would add one more weight-sized buffer at the start of
  // every backward (154 MB for GPT-2 small's head) — so a graph can be
  // differentiated once only; a second backward through a retained graph is an
  // error instead of a wrong gradient.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    GA_CHECK(!ctx->saved_data.count("differentiated"),
             "chunked cross-entropy: a second backward through the same graph (retain_graph) is "
             "not supported: the gradients were computed in the forward and consumed by the first");
    ctx->saved_data["differentiated"] = true;
    const auto& grad_sum = grad_outputs[0];
    torch::Tensor grad_hidden = take_saved(ctx, "grad_hidden");
    torch::Tensor grad_weight = take_saved(ctx, "grad_weight");
    if (grad_hidden.defined()) grad_hidden.mul_(grad_sum.to(grad_hidden.scalar_type()));
    if (grad_weight.defined()) grad_weight.mul_(grad_sum.to(grad_weight.scalar_type()));
    // The weight's gradient was accumulated in the softmax dtype; hand it back in weight's.
    const auto weight_dtype = ctx->saved_data["weight_dtype"].toScalarType();
    if (grad_weight.defined()) grad_weight = grad_weight.to(weight_dtype);
    // A tied table's lookup adds its rows into the weight's gradient and returns the sum.
    const auto tied = ctx->saved_data.find("tied_table");
    if (tied != ctx->saved_data.end() && grad_weight.defined()) {
      grad_weight =
          c10::static_intrusive_pointer_cast<TiedTableGradient>(tied->second.toCapsule())->hand_over(grad_weight);
    }
    variable_list grads(10);  // one per argument of forward(); only hidden and weight get one
    grads[0] = grad_hidden;
    grads[1] = grad_weight;
    return grads;
  }
};

// The scored positions of the flat shifted labels `next` and their targets:
// padding and ignored labels then cost no projection. nonzero() reads the
// labels on the host; on the CPU, where that is free, so does the check that
// every target lies in [0, vocab).
std::pair<torch::Tensor, torch::Tensor> compact_targets(const torch::Tensor& next, const torch::Tensor& scored,
                                                        int64_t vocab) {
  auto positions = scored.nonzero().reshape({-1});
  auto targets = next.index_select(0, positions);
  if (targets.is_cpu() && targets.numel() > 0) {
    const auto bad = targets.lt(0).logical_or(targets.ge(vocab));
    if (bad.any().item<bool>()) {
      throw Error(fmt::format("chunked cross-entropy: label {} is outside the vocabulary [0, {})",
                              targets.masked_select(bad)[0].item<int64_t>(), vocab));
    }
  }
  return {positions, targets};
}

}  // namespace

core::LossSum chunked_causal_lm_loss(const torch::Tensor& hidden, const torch::Tensor& weight,
                                     const torch::Tensor& labels, int64_t chunk_tokens, TargetSelection selection,
                                     const c10::intrusive_ptr<TiedTableGradient>& tied_table) {
  GA_CHECK(chunk_tokens > 0, "chunked cross-entropy: chunk_tokens must be positive, got {}", chunk_tokens);
  GA_CHECK(hidden.defined() && weight.defined() && labels.defined(),
           "chunked cross-entropy: hidden, weight and labels must all be defined");
  GA_CHECK(
      hidden.dim() == 3 && labels.dim() == 2 && hidden.size(0) == labels.size(0) && hidden.size(1) == labels.size(1),
      "chunked cross-entropy: hidden states {} do not match labels {} (want [B, T, H], [B, T])",
      sizes_text(hidden.sizes()), sizes_text(labels.sizes()));
  GA_CHECK(weight.dim() == 2 && weight.size(1) == hidden.size(2),
           "chunked cross-entropy: weight {} does not match hidden states {} (want [V, H])", sizes_text(weight.sizes()),
           sizes_text(hidden.sizes()));
  GA_CHECK(hidden.is_floating_point() && weight.is_floating_point(),
           "chunked cross-entropy: hidden states and weight must be floating point");
  GA_CHECK(labels.scalar_type() == torch::kLong || labels.scalar_type() == torch::kInt,
           "chunked cross-entropy: labels must be int64 or int32");

  const int64_t batch = labels.size(0);
  const int64_t time = labels.size(1);
  // The shift: position t is scored against labels[:, t + 1]; the last
  // position of each row has no label (core::kIgnoreIndex).
  auto next = torch::full({batch, time}, core::kIgnoreIndex, labels.options().dtype(torch::kLong));
  if (time > 1) next.slice(1, 0, time - 1).copy_(labels.slice(1, 1, time));
  next = next.reshape({-1});
  const auto scored = next.ne(core::kIgnoreIndex);
  const int64_t vocab = weight.size(0);
  if (selection == TargetSelection::automatic) {
    selection = hidden.is_cpu() ? TargetSelection::compact : TargetSelection::masked;
  }

  const bool compact = selection == TargetSelection::compact;
  torch::Tensor positions, targets, valid;
  if (compact) {
    // The same call either way; on the CPU, where reading the labels is free, it runs inside
    // the range of expected host reads (base/host_reads.h).
    if (labels.is_cpu()) {
      GRADACCUM_CPU_HOST_READ_SCOPE();
      std::tie(positions, targets) = compact_targets(next, scored, vocab);
    } else {
      std::tie(positions, targets) = compact_targets(next, scored, vocab);
    }
    positions = positions.to(hidden.device());
    valid = torch::empty({0}, hidden.options());
  } else {
    // Every position, the ignored ones scored against id 0 and then zeroed.
    targets = next.clamp_min(0);
    valid = scored.to(hidden.options().dtype(precision_of(hidden, weight).softmax));
    positions = torch::empty({0}, next.options().device(hidden.device()));
  }
  // Which gradients the forward must compute: decided here, where grad mode is
  // still the caller's (the Function's forward runs with it off).
  const bool grad_mode = torch::GradMode::is_enabled();
  auto sum =
      ChunkedCrossEntropy::apply(hidden, weight, positions, targets.to(hidden.device()), valid, compact, chunk_tokens,
                                 grad_mode && hidden.requires_grad(), grad_mode && weight.requires_grad(), tied_table);
  auto count = compact ? torch::scalar_tensor(positions.size(0), labels.options().dtype(torch::kLong)) : scored.sum();
  return {sum, count};
}

}  // namespace gradaccum::models
