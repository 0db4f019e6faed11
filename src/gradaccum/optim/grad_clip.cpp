#include "gradaccum/optim/grad_clip.h"

namespace gradaccum::optim {

namespace {
torch::Tensor norm_of(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> norms;
  norms.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t.defined()) norms.push_back(torch::linalg_vector_norm(t.detach(), 2, {}, false, torch::kDouble));
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

torch::Tensor global_weight_norm(const std::vector<torch::Tensor>& params) {
  return norm_of(params);
}

ClipResult clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  return clip_grad_norm(params, max_norm, global_grad_norm(params));
}

ClipResult clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                          const torch::Tensor& before) {
  if (max_norm <= 0.0) return {before, before};
  auto coefficient = (max_norm / (before + 1e-6)).clamp_max(1.0);
  for (const auto& p : params) {
    auto g = p.grad();
    if (g.defined()) g.mul_(coefficient.to(g.device(), g.scalar_type()));
  }
  return {before, before * coefficient};
}

}  // namespace gradaccum::optim
