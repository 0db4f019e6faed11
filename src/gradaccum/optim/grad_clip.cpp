#include "gradaccum/optim/grad_clip.h"

namespace gradaccum::optim {

namespace {
torch::Tensor norm_of(const std::vector<torch::Tensor>& tensors) {
  // Outside the graph without a detached view per tensor (this runs every step).
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;
  norms.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t.defined()) norms.push_back(torch::linalg_vector_norm(t, 2, {}, false, torch::kDouble));
  }
  if (norms.empty()) return torch::zeros({}, torch::kDouble);
  return torch::linalg_vector_norm(torch::stack(norms), 2);
}
}  // namespace

torch::Tensor global_grad_norm(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) grads.push_back(p.grad());
  return norm_of(grads);
}

torch::Tensor global_weight_norm(const std::vector<torch::Tensor>& params) { return norm_of(params); }

ClipResult clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  return clip_grad_norm(params, max_norm, global_grad_norm(params));
}

ClipResult clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm, const torch::Tensor& before) {
  if (max_norm <= 0.0) return {before, before};
  auto coefficient = (max_norm / (before + 1e-6)).clamp_max(1.0);
  torch::Tensor factor;  // `coefficient` as the gradients' device and dtype, converted once
  for (const auto& p : params) {
    auto g = p.grad();
    if (!g.defined()) continue;
    if (!factor.defined() || factor.device() != g.device() || factor.scalar_type() != g.scalar_type()) {
      factor = coefficient.to(g.device(), g.scalar_type());
    }
    g.mul_(factor);
  }
  return {before, before * coefficient};
}

}  // namespace gradaccum::optim
