#include "gradaccum/optim/fused_adamw.h"

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gradaccum/base/host_reads.h"

namespace gradaccum::optim {

namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

// The parameters of one group that at::_fused_adamw_ updates together: one device and dtype.
struct FusedBatch {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
};

void run_fused(FusedBatch& b, const AdamWOptions& options) {
  const auto [beta1, beta2] = options.betas();
  if (b.params.front().is_cpu()) {
    // The CPU kernel reads each step count with item(): CPU tensors, so no wait (the CUDA
    // kernel reads them on the device).
    GRADACCUM_CPU_HOST_READ_SCOPE();
    at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs, b.steps, options.lr(), beta1,
                      beta2, options.weight_decay(), options.eps(), options.amsgrad(), /*maximize=*/false);
    return;
  }
  at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs, b.steps, options.lr(), beta1,
                    beta2, options.weight_decay(), options.eps(), options.amsgrad(), /*maximize=*/false);
}

// torch::optim::AdamW's operator sequence at step t, for the tensors the fused op cannot take.
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
         state.exp_avg_sq().is_contiguous() && (!options.amsgrad() || state.max_exp_avg_sq().is_contiguous());
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
    std::map<std::pair<std::string, torch::ScalarType>, FusedBatch> batches;
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
      auto& batch = batches[{p.device().str(), p.scalar_type()}];
      batch.params.push_back(p);
      batch.grads.push_back(grad);
      batch.exp_avgs.push_back(state.exp_avg());
      batch.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (options.amsgrad()) batch.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      // The step count as the fused op reads it (it does not advance it): a float32
      // scalar on the parameter's device.
      batch.steps.push_back(torch::full({}, t, p.options().dtype(torch::kFloat)));
    }
    for (auto& [where, batch] : batches) run_fused(batch, options);
  }
  return loss;
}

}  // namespace gradaccum::optim
