#include "gradaccum/optim/fused_adamw.h"

#include <ATen/Parallel.h>
#include <c10/util/string_utils.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gradaccum/core/custom_kernels.h"
#include "gradaccum/optim/adamw_update.h"

namespace gradaccum::optim {

namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

// The parameters of one group that libtorch's fused AdamW (at::_fused_adamw_,
// what torch.optim.AdamW(fused=True) runs) updates together: one device and dtype.
struct LibtorchBatch {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
};

void run_libtorch_fused(LibtorchBatch& b, const AdamWOptions& options) {
  const auto [beta1, beta2] = options.betas();
  at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs, b.steps,
                    options.lr(), beta1, beta2, options.weight_decay(), options.eps(),
                    options.amsgrad(), /*maximize=*/false);
}

// libtorch's operator sequence (torch::optim::AdamW's), for the tensors the fused op
// cannot take: its CPU kernel walks the four tensors' memory in step and silently
// mis-updates a parameter whose layout differs from its gradient's (torch 2.15: a
// transposed parameter moved by 2·lr where AdamW moves it by lr).
void update_with_operators(torch::Tensor& p, const torch::Tensor& grad, AdamWParamState& state,
                           const AdamWOptions& options, double t) {
  const auto [beta1, beta2] = options.betas();
  if (options.weight_decay() != 0) p.mul_(1.0 - options.lr() * options.weight_decay());
  state.exp_avg().mul_(beta1).add_(grad, 1.0 - beta1);
  state.exp_avg_sq().mul_(beta2).addcmul_(grad, grad, 1.0 - beta2);
  const double root_bias2 = std::sqrt(1.0 - std::pow(beta2, t));
  torch::Tensor denom;
  if (options.amsgrad()) {
    torch::max_out(state.max_exp_avg_sq(), state.exp_avg_sq(), state.max_exp_avg_sq());
    denom = (state.max_exp_avg_sq().sqrt() / root_bias2).add_(options.eps());
  } else {
    denom = (state.exp_avg_sq().sqrt() / root_bias2).add_(options.eps());
  }
  p.addcdiv_(state.exp_avg(), denom, -options.lr() / (1.0 - std::pow(beta1, t)));
}

bool all_contiguous(const torch::Tensor& p, const torch::Tensor& grad, AdamWParamState& state,
                    const AdamWOptions& options) {
  return p.is_contiguous() && grad.is_contiguous() && state.exp_avg().is_contiguous() &&
         state.exp_avg_sq().is_contiguous() &&
         (!options.amsgrad() || state.max_exp_avg_sq().is_contiguous());
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
  const bool own_loop = core::custom_kernel_enabled(core::CustomKernel::fused_adamw);
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const AdamWOptions&>(group.options());
    std::map<std::pair<std::string, torch::ScalarType>, LibtorchBatch> batches;
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
      const auto t = static_cast<double>(state.step());
      if (!all_contiguous(p, grad, state, options)) {
        update_with_operators(p, grad, state, options, t);
        continue;
      }
      if (!own_loop || !takes_one_pass(p, grad, state, options)) {
        // The step count as the fused op reads it: a float32 scalar on the parameter's device.
        auto& batch = batches[{p.device().str(), p.scalar_type()}];
        batch.params.push_back(p);
        batch.grads.push_back(grad);
        batch.exp_avgs.push_back(state.exp_avg());
        batch.exp_avg_sqs.push_back(state.exp_avg_sq());
        if (options.amsgrad()) batch.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
        batch.steps.push_back(torch::full({}, t, p.options().dtype(torch::kFloat)));
        continue;
      }
      const auto [beta1, beta2] = options.betas();
      const AdamWCoefficients c{1.0 - options.lr() * options.weight_decay(),
                                beta1,
                                beta2,
                                options.lr() / (1.0 - std::pow(beta1, t)),
                                std::sqrt(1.0 - std::pow(beta2, t)),
                                options.eps()};
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
    for (auto& [where, batch] : batches) run_libtorch_fused(batch, options);
  }
  return loss;
}

}  // namespace gradaccum::optim
