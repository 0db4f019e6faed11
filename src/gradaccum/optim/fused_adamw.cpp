#include "gradaccum/optim/fused_adamw.h"

#include <ATen/Parallel.h>
#include <c10/util/string_utils.h>

#include <cmath>

#include "gradaccum/optim/adamw_update.h"

namespace gradaccum::optim {

namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

// libtorch's own operator sequence, for every parameter the loop does not take.
void update_with_operators(torch::Tensor& p, const torch::Tensor& grad, AdamWParamState& state,
                           const AdamWOptions& options, const AdamWCoefficients& c) {
  if (options.weight_decay() != 0) p.mul_(c.decay);
  state.exp_avg().mul_(c.beta1).add_(grad, 1.0 - c.beta1);
  state.exp_avg_sq().mul_(c.beta2).addcmul_(grad, grad, 1.0 - c.beta2);
  torch::Tensor denom;
  if (options.amsgrad()) {
    torch::max_out(state.max_exp_avg_sq(), state.exp_avg_sq(), state.max_exp_avg_sq());
    denom = (state.max_exp_avg_sq().sqrt() / c.root_bias2).add_(c.eps);
  } else {
    denom = (state.exp_avg_sq().sqrt() / c.root_bias2).add_(c.eps);
  }
  p.addcdiv_(state.exp_avg(), denom, -c.step_size);
}

bool contiguous_cpu(const torch::Tensor& t, torch::ScalarType dtype) {
  return t.device().is_cpu() && t.layout() == torch::kStrided && t.scalar_type() == dtype &&
         t.is_contiguous();
}

bool takes_one_pass(const torch::Tensor& p, const torch::Tensor& grad, AdamWParamState& state,
                    const AdamWOptions& options) {
  const auto dtype = p.scalar_type();
  return !options.amsgrad() && (dtype == torch::kFloat || dtype == torch::kDouble) &&
         contiguous_cpu(p, dtype) && contiguous_cpu(grad, dtype) &&
         contiguous_cpu(state.exp_avg(), dtype) && contiguous_cpu(state.exp_avg_sq(), dtype);
}

}  // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      const auto& grad = p.grad();
      if (!grad.defined()) continue;
      TORCH_CHECK(!grad.is_sparse(), "AdamW does not support sparse gradients");
      // The key libtorch's AdamW files state under, so its save/load apply.
      void* const key = p.unsafeGetTensorImpl();
      auto it = state_.find(key);
      if (it == state_.end()) {
        auto fresh = std::make_unique<AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (options.amsgrad()) fresh->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = state_.emplace(key, std::move(fresh)).first;
      }
      auto& state = static_cast<AdamWParamState&>(*it->second);
      state.step(state.step() + 1);
      const auto [beta1, beta2] = options.betas();
      const auto t = static_cast<double>(state.step());
      const AdamWCoefficients c{1.0 - options.lr() * options.weight_decay(),
                           beta1,
                           beta2,
                           options.lr() / (1.0 - std::pow(beta1, t)),
                           std::sqrt(1.0 - std::pow(beta2, t)),
                           options.eps()};
      if (!takes_one_pass(p, grad, state, options)) {
        update_with_operators(p, grad, state, options, c);
        continue;
      }
      AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "fused_adamw", [&] {
        auto* param = p.data_ptr<scalar_t>();
        const auto* g = grad.data_ptr<scalar_t>();
        auto* m = state.exp_avg().data_ptr<scalar_t>();
        auto* v = state.exp_avg_sq().data_ptr<scalar_t>();
        // Chunks of 32K elements: small parameters stay on the calling thread.
        at::parallel_for(0, p.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
          adamw_update(param, g, m, v, begin, end, c);
        });
      });
    }
  }
  return loss;
}

}  // namespace gradaccum::optim
