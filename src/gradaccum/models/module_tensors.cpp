#include "gradaccum/models/module_tensors.h"

#include <fmt/ranges.h>

#include <map>

#include "gradaccum/base/check.h"

namespace gradaccum::models {

namespace {
std::vector<std::pair<std::string, torch::Tensor>> slots(torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> all;
  for (const auto& item : module.named_parameters()) all.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers()) all.emplace_back(item.key(), item.value());
  return all;
}
}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> module_tensors(torch::nn::Module& module) {
  auto all = slots(module);
  for (auto& [name, t] : all) t = t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
  return all;
}

void load_module_tensors(torch::nn::Module& module, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                         const std::string& what) {
  std::map<std::string, torch::Tensor> given;
  for (const auto& [name, t] : tensors) {
    GA_CHECK(given.emplace(name, t).second, "{}: tensor '{}' appears twice", what, name);
  }
  auto targets = slots(module);
  for (const auto& [name, target] : targets) {
    auto it = given.find(name);
    GA_CHECK(it != given.end(), "{}: tensor '{}' is missing", what, name);
    GA_CHECK(it->second.sizes() == target.sizes(), "{}: tensor '{}' has shape {}, the model expects {}", what, name,
             fmt::format("[{}]", fmt::join(it->second.sizes(), ", ")),
             fmt::format("[{}]", fmt::join(target.sizes(), ", ")));
    given.erase(it);
  }
  GA_CHECK(given.empty(), "{}: tensor '{}' does not belong to this model", what, given.begin()->first);
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> source(tensors.begin(), tensors.end());
  for (auto& [name, target] : targets) target.copy_(source.at(name));
}

}  // namespace gradaccum::models
