#include "gradaccum/optim/optimizer_factory.h"

#include "gradaccum/base/check.h"
#include "gradaccum/optim/fused_adamw.h"

namespace gradaccum::optim {

bool takes_weight_decay(const torch::Tensor& param) { return param.dim() >= 2; }

namespace {

// One group, or (with weight decay) the decayed parameters and then the others.
struct Groups {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::vector<double> weight_decay;  // per group
};

Groups group_by_decay(std::vector<torch::Tensor> params, std::vector<bool> decayed, double weight_decay) {
  if (decayed.empty()) {
    for (const auto& p : params) decayed.push_back(takes_weight_decay(p));
  }
  GA_CHECK(decayed.size() == params.size(), "make_optimizer: {} weight-decay flags for {} parameters", decayed.size(),
           params.size());
  std::vector<torch::Tensor> with, without;
  for (size_t i = 0; i < params.size(); ++i) (decayed[i] ? with : without).push_back(params[i]);
  Groups out;
  if (weight_decay == 0.0 || with.empty() || without.empty()) {
    out.groups.emplace_back(std::move(params));
    out.weight_decay.push_back(with.empty() ? 0.0 : weight_decay);
    return out;
  }
  out.groups.emplace_back(std::move(with));
  out.groups.emplace_back(std::move(without));
  out.weight_decay = {weight_decay, 0.0};
  return out;
}

// Each group's weight decay, set after construction: libtorch 2.x replaces a group option
// that equals the options' constructor default with the optimizer's default, so a group's 0
// under SGD (or 0.01 under AdamW) would silently become the other group's value.
template <typename Options>
std::unique_ptr<torch::optim::Optimizer> set_weight_decay(std::unique_ptr<torch::optim::Optimizer> optimizer,
                                                          const std::vector<double>& weight_decay) {
  auto& groups = optimizer->param_groups();
  GA_CHECK(groups.size() == weight_decay.size(), "make_optimizer: {} groups, {} weight decays", groups.size(),
           weight_decay.size());
  for (size_t g = 0; g < groups.size(); ++g) static_cast<Options&>(groups[g].options()).weight_decay(weight_decay[g]);
  return optimizer;
}

}  // namespace

const base::EnumNames<OptimizerType>& optimizer_type_names() {
  static const base::EnumNames<OptimizerType> names{{OptimizerType::adamw, "adamw"}, {OptimizerType::sgd, "sgd"}};
  return names;
}

std::string to_string(OptimizerType type) { return optimizer_type_names().name(type); }

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec, std::vector<torch::Tensor> params,
                                                        std::vector<bool> decayed) {
  auto grouped = group_by_decay(std::move(params), std::move(decayed), spec.weight_decay);
  switch (spec.type) {
    case OptimizerType::adamw: {
      auto options = torch::optim::AdamWOptions(spec.learning_rate)
                         .betas({spec.adam_beta1, spec.adam_beta2})
                         .eps(spec.adam_epsilon)
                         .weight_decay(spec.weight_decay);
      return set_weight_decay<torch::optim::AdamWOptions>(
          std::make_unique<FusedAdamW>(std::move(grouped.groups), options), grouped.weight_decay);
    }
    case OptimizerType::sgd: {
      GA_CHECK(!spec.nesterov || spec.momentum > 0.0, "nesterov: true needs momentum > 0");
      auto options = torch::optim::SGDOptions(spec.learning_rate)
                         .momentum(spec.momentum)
                         .nesterov(spec.nesterov)
                         .weight_decay(spec.weight_decay);
      return set_weight_decay<torch::optim::SGDOptions>(
          std::make_unique<torch::optim::SGD>(std::move(grouped.groups), options), grouped.weight_decay);
    }
  }
  throw Error(fmt::format("optim: no optimizer of type {}", static_cast<int>(spec.type)));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace gradaccum::optim
