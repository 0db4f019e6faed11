// Builds the optimizers (libtorch's SGD with momentum/Nesterov; AdamW through
// libtorch's fused AdamW op, optim/fused_adamw.h) from the
// configuration and sets their learning rate.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace gradaccum::optim {

struct OptimizerSpec {
  std::string type = "adamw";  // adamw | sgd
  double learning_rate = 1e-3;
  double weight_decay = 0.0;
  double momentum = 0.0;  // sgd
  bool nesterov = false;  // sgd
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
};

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        std::vector<torch::Tensor> params);

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace gradaccum::optim
