// An optimizer's state as tensors under parameter names, for checkpoints.
//
// libtorch keys its optimizer state by TensorImpl pointer (since 2.2) and serializes it in
// TorchScript archives (deprecated since 2.11); neither survives a change of process or
// library. Here every state tensor is named after its parameter, so a checkpoint is a plain
// safetensors file that any reader can open and that does not depend on parameter order:
//   "<param>.step"             int64 scalar: the optimizer steps this parameter has taken
//                              (AdamW, whose bias correction needs it)
//   "<param>.exp_avg"          AdamW's first moment
//   "<param>.exp_avg_sq"       AdamW's second moment
//   "<param>.max_exp_avg_sq"   AdamW with amsgrad
//   "<param>.momentum_buffer"  SGD with momentum
// A parameter without state (never stepped) has no entries. Hyperparameters are not state:
// they come from the run's configuration, and the learning rate from the schedule.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace gradaccum::optim {

using NamedStateTensors = std::vector<std::pair<std::string, torch::Tensor>>;
// Parameters under their names (a module's named_parameters()); the optimizer's parameters
// are matched by identity, so its param groups may hold them in any order.
using NamedParameters = std::vector<std::pair<std::string, torch::Tensor>>;

// The tensors are the state itself, not copies. Every parameter of the optimizer must be in
// `params`. Throws gradaccum::Error for an optimizer state of a kind this file does not list.
NamedStateTensors optimizer_state(const torch::optim::Optimizer& optimizer, const NamedParameters& params);

// Replaces the optimizer's state with `state` (as optimizer_state() names it), copied to each
// parameter's device and dtype. Every tensor must belong to a named parameter and have its
// shape; `what` names the source in the one-line gradaccum::Error otherwise.
void load_optimizer_state(torch::optim::Optimizer& optimizer, const NamedParameters& params,
                          const NamedStateTensors& state, const std::string& what);

}  // namespace gradaccum::optim
