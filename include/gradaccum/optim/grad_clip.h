// Clipping by global gradient norm without a host synchronization: the norm
// and the clip coefficient stay tensors (torch::nn::utils::clip_grad_norm_
// returns a double, which would sync every step).
#pragma once

#include <torch/torch.h>

#include <vector>

namespace gradaccum::optim {

struct ClipResult {
  torch::Tensor norm_before;  // 0-dim float64: ‖g‖₂ over all parameters
  torch::Tensor norm_after;   // 0-dim float64: after clipping (== before when not clipped)
};

// ‖g‖₂ over all gradients (float64, 0-dim; zero when no gradient is defined).
torch::Tensor global_grad_norm(const std::vector<torch::Tensor>& params);
// ‖θ‖₂ over all parameters (float64, 0-dim).
torch::Tensor global_weight_norm(const std::vector<torch::Tensor>& params);
// ‖·‖₂ over the defined tensors of `tensors` (float64, 0-dim; zero when none is defined).
torch::Tensor tensors_norm(const std::vector<torch::Tensor>& tensors);

// Scales the gradients by min(1, max_norm / (‖g‖ + 1e-6)), as PyTorch's
// clip_grad_norm_. max_norm <= 0 disables clipping (the norm is still measured).
ClipResult clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);
// The same with the norm already measured (global_grad_norm(params)).
ClipResult clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm, const torch::Tensor& norm_before);
// The same on the gradient tensors themselves (undefined ones skipped), whose norm over every
// rank is `norm_before`: a rank that holds a shard of the gradient scales its shard.
ClipResult clip_gradients(const std::vector<torch::Tensor>& gradients, double max_norm,
                          const torch::Tensor& norm_before);

}  // namespace gradaccum::optim
