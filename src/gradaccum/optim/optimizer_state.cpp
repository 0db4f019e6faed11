#include "gradaccum/optim/optimizer_state.h"

#include <map>
#include <memory>

#include "gradaccum/base/check.h"

namespace gradaccum::optim {
namespace {

enum class Kind { adamw, sgd };

Kind kind_of(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr) return Kind::adamw;
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr) return Kind::sgd;
  throw Error("checkpoint: optimizer state of this optimizer type cannot be saved (adamw and sgd can)");
}

std::vector<torch::Tensor> parameters_of(const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) params.push_back(p);
  }
  return params;
}

// The name of each of the optimizer's parameters, in parameters_of() order.
std::vector<std::string> names_of(const std::vector<torch::Tensor>& params, const NamedParameters& named) {
  std::map<const c10::TensorImpl*, const std::string*> by_identity;
  for (const auto& [name, p] : named) by_identity.emplace(p.unsafeGetTensorImpl(), &name);
  std::vector<std::string> names;
  for (const auto& p : params) {
    const auto it = by_identity.find(p.unsafeGetTensorImpl());
    GA_CHECK(it != by_identity.end(), "checkpoint: the optimizer holds a parameter of shape {} that has no name",
             fmt::join(p.sizes(), "x"));
    names.push_back(*it->second);
  }
  return names;
}

const char* const kAdamWFields[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

}  // namespace

NamedStateTensors optimizer_state(const torch::optim::Optimizer& optimizer, const NamedParameters& named) {
  const auto kind = kind_of(optimizer);
  const auto params = parameters_of(optimizer);
  const auto names = names_of(params, named);
  NamedStateTensors state;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = optimizer.state().find(params[i].unsafeGetTensorImpl());
    if (it == optimizer.state().end()) continue;
    const auto& name = names[i];
    if (kind == Kind::adamw) {
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      state.emplace_back(name + ".step", torch::full({}, s.step(), torch::kLong));
      const torch::Tensor fields[] = {s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()};
      for (size_t f = 0; f < 3; ++f) {
        if (fields[f].defined()) state.emplace_back(name + "." + kAdamWFields[f], fields[f]);
      }
    } else {
      const auto& s = static_cast<const torch::optim::SGDParamState&>(*it->second);
      if (s.momentum_buffer().defined()) state.emplace_back(name + ".momentum_buffer", s.momentum_buffer());
    }
  }
  return state;
}

void load_optimizer_state(torch::optim::Optimizer& optimizer, const NamedParameters& named,
                          const NamedStateTensors& state, const std::string& what) {
  const auto kind = kind_of(optimizer);
  const auto params = parameters_of(optimizer);
  const auto names = names_of(params, named);
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < names.size(); ++i) index.emplace(names[i], i);

  // Group the tensors by parameter: "<param>.<field>", the field after the last dot.
  std::map<size_t, std::map<std::string, torch::Tensor>> by_param;
  for (const auto& [key, tensor] : state) {
    const auto dot = key.rfind('.');
    const auto it = dot == std::string::npos ? index.end() : index.find(key.substr(0, dot));
    GA_CHECK(it != index.end(), "{}: optimizer state {} belongs to no parameter of this model", what, key);
    const auto field = key.substr(dot + 1);
    const auto& p = params[it->second];
    if (field == "step") {
      GA_CHECK(kind == Kind::adamw && tensor.dim() == 0 && tensor.scalar_type() == torch::kLong,
               "{}: optimizer state {} is not an int64 scalar of an AdamW state", what, key);
    } else {
      const bool known = kind == Kind::adamw
                             ? field == kAdamWFields[0] || field == kAdamWFields[1] || field == kAdamWFields[2]
                             : field == "momentum_buffer";
      GA_CHECK(known, "{}: optimizer state {} is not a field of this optimizer's state", what, key);
      GA_CHECK(tensor.sizes() == p.sizes(), "{}: optimizer state {} has shape {}, its parameter {}", what, key,
               fmt::join(tensor.sizes(), "x"), fmt::join(p.sizes(), "x"));
    }
    by_param[it->second][field] = tensor;
  }

  auto to_param = [](const torch::Tensor& t, const torch::Tensor& p) {
    return t.defined() ? t.to(p.device(), p.scalar_type()).clone() : torch::Tensor();
  };
  optimizer.state().clear();
  for (const auto& [i, fields] : by_param) {
    const auto& p = params[i];
    auto get = [&fields = fields](const std::string& f) {
      const auto it = fields.find(f);
      return it == fields.end() ? torch::Tensor() : it->second;
    };
    if (kind == Kind::adamw) {
      GA_CHECK(get("step").defined() && get("exp_avg").defined() && get("exp_avg_sq").defined(),
               "{}: the AdamW state of {} lacks step, exp_avg or exp_avg_sq", what, names[i]);
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(get("step").item<int64_t>());
      s->exp_avg(to_param(get("exp_avg"), p));
      s->exp_avg_sq(to_param(get("exp_avg_sq"), p));
      s->max_exp_avg_sq(to_param(get("max_exp_avg_sq"), p));
      optimizer.state()[p.unsafeGetTensorImpl()] = std::move(s);
    } else {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(to_param(get("momentum_buffer"), p));
      optimizer.state()[p.unsafeGetTensorImpl()] = std::move(s);
    }
  }
}

}  // namespace gradaccum::optim
