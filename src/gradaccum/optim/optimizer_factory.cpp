#include "gradaccum/optim/optimizer_factory.h"

#include "gradaccum/core/check.h"
#include "gradaccum/optim/fused_adamw.h"

namespace gradaccum::optim {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        std::vector<torch::Tensor> params) {
  if (spec.type == "adamw") {
    auto options = torch::optim::AdamWOptions(spec.learning_rate)
                       .betas({spec.adam_beta1, spec.adam_beta2})
                       .eps(spec.adam_epsilon)
                       .weight_decay(spec.weight_decay);
    return std::make_unique<FusedAdamW>(std::move(params), options);
  }
  if (spec.type == "sgd") {
    GA_CHECK(!spec.nesterov || spec.momentum > 0.0, "nesterov: true needs momentum > 0");
    auto options = torch::optim::SGDOptions(spec.learning_rate)
                       .momentum(spec.momentum)
                       .nesterov(spec.nesterov)
                       .weight_decay(spec.weight_decay);
    return std::make_unique<torch::optim::SGD>(std::move(params), options);
  }
  throw Error(fmt::format("optim: unknown optimizer '{}' (adamw | sgd)", spec.type));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace gradaccum::optim
