#include "gradaccum/core/batch_dependence.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gradaccum::core {

std::vector<std::string> batch_dependent_layers(const torch::nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& item : module.named_modules("model")) {
    const torch::nn::Module* m = item.value().get();
    const bool batch_norm = dynamic_cast<const torch::nn::BatchNorm1dImpl*>(m) != nullptr ||
                            dynamic_cast<const torch::nn::BatchNorm2dImpl*>(m) != nullptr ||
                            dynamic_cast<const torch::nn::BatchNorm3dImpl*>(m) != nullptr;
    if (batch_norm && m->is_training()) names.push_back(item.key());
  }
  return names;
}

std::string batch_dependence_warning(const torch::nn::Module& module, int64_t accumulation_steps, int64_t world_size) {
  if (accumulation_steps <= 1 && world_size <= 1) return "";
  const auto names = batch_dependent_layers(module);
  if (names.empty()) return "";
  return fmt::format(
      "warning: BatchNorm in training mode ({}) normalizes each micro-batch with its own "
      "statistics, so accumulating {} micro-batches x {} ranks is not equivalent to the full "
      "batch; use `--set model.norm=group` (or layer) for exact accumulation",
      fmt::join(names, ", "), accumulation_steps, world_size);
}

}  // namespace gradaccum::core
