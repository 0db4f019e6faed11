#include "gradaccum/optim/grad_clip.h"

#include <algorithm>

#include "gradaccum/base/host_reads.h"

namespace gradaccum::optim {

namespace {
// ‖t‖₂ in float64 (1 element). ATen computes a float64 norm of a float32 tensor
// on a float64 copy of it (a reduction casts its input to its output dtype).
torch::Tensor float64_norm(const torch::Tensor& t) {
  return torch::linalg_vector_norm(t, 2, {}, false, torch::kDouble).reshape({1});
}

// ‖t‖₂ of a 16/32-bit CPU tensor, in float64 (1 element), without that copy: the
// copies made norm_of() ~1.5% of the GPT benchmark's step, two per step over
// every parameter. A float32 norm of the whole tensor is off by ~2e-5 relative at
// 1.5M elements (its vector lanes add sequentially), so the tensor is reduced in
// float32 over rows of kRow elements (~1e-10 relative) and the rows' norms are
// combined in float64: ~7× faster. Float32 squares overflow above ~1.8e19 and
// underflow below ~1e-19; norm_of() redoes such tensors in float64.
torch::Tensor row_wise_norm(const torch::Tensor& t) {
  constexpr int64_t kRow = 256;
  const auto flat = t.reshape({-1});
  const int64_t body = flat.numel() / kRow * kRow;
  auto rows = torch::linalg_vector_norm(flat.slice(0, 0, body).view({-1, kRow}), 2, {1}, false, torch::kFloat);
  if (body < flat.numel()) {
    rows = torch::cat({rows, torch::linalg_vector_norm(flat.slice(0, body), 2, {}, false, torch::kFloat).reshape({1})});
  }
  return torch::linalg_vector_norm(rows.to(torch::kDouble), 2).reshape({1});
}

// Below this, a tensor's norm may owe part of itself to float32 squares that
// underflowed (at most √256 · 1e-19 ≈ 2e-18 per row).
constexpr double kRowWiseFloor = 1e-10;

torch::Tensor norm_of(const std::vector<torch::Tensor>& tensors) {
  // Outside the graph without a detached view per tensor (this runs every step).
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> defined;
  for (const auto& t : tensors) {
    if (t.defined()) defined.push_back(t);
  }
  if (defined.empty()) return torch::zeros({}, torch::kDouble);
  // Off the CPU the copy is cheap next to a host read, which would stall the device.
  const bool row_wise = std::all_of(defined.begin(), defined.end(), [](const torch::Tensor& t) {
    return t.is_cpu() && t.scalar_type() != torch::kDouble;
  });
  std::vector<torch::Tensor> norms;
  norms.reserve(defined.size());
  for (const auto& t : defined) norms.push_back(row_wise ? row_wise_norm(t) : float64_norm(t));
  auto all = torch::cat(norms);
  if (row_wise) {
    GRADACCUM_CPU_HOST_READ_SCOPE();
    const auto doubtful = all.isfinite().logical_and(all.ge(kRowWiseFloor)).logical_not();
    const auto redo = doubtful.nonzero().reshape({-1}).contiguous();
    const int64_t* index = redo.data_ptr<int64_t>();
    for (int64_t j = 0; j < redo.numel(); ++j) {
      all.narrow(0, index[j], 1).copy_(float64_norm(defined[static_cast<size_t>(index[j])]));
    }
  }
  return torch::linalg_vector_norm(all, 2);
}
}  // namespace

torch::Tensor global_grad_norm(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) grads.push_back(p.grad());
  return norm_of(grads);
}

torch::Tensor global_weight_norm(const std::vector<torch::Tensor>& params) { return norm_of(params); }

torch::Tensor tensors_norm(const std::vector<torch::Tensor>& tensors) { return norm_of(tensors); }

ClipResult clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  return clip_grad_norm(params, max_norm, global_grad_norm(params));
}

ClipResult clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm, const torch::Tensor& before) {
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) grads.push_back(p.grad());
  return clip_gradients(grads, max_norm, before);
}

ClipResult clip_gradients(const std::vector<torch::Tensor>& gradients, double max_norm, const torch::Tensor& before) {
  if (max_norm <= 0.0) return {before, before};
  auto coefficient = (max_norm / (before + 1e-6)).clamp_max(1.0);
  torch::Tensor factor;  // `coefficient` as the gradients' device and dtype, converted once
  for (const auto& g : gradients) {
    if (!g.defined()) continue;
    if (!factor.defined() || factor.device() != g.device() || factor.scalar_type() != g.scalar_type()) {
      factor = coefficient.to(g.device(), g.scalar_type());
    }
    g.mul_(factor);
  }
  return {before, before * coefficient};
}

}  // namespace gradaccum::optim
