// A module's weights as named tensors, for models without a Hugging Face
// layout (the image networks): every parameter and buffer (BatchNorm's running
// statistics included) under libtorch's own dotted names.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace gradaccum::models {

// CPU copies, in the module's registration order.
std::vector<std::pair<std::string, torch::Tensor>> module_tensors(torch::nn::Module& module);

// Copies `tensors` into the module (converting dtype and device). Everything is
// checked first — a missing name, an unknown name, a shape mismatch are errors
// naming the tensor and `what` — so on error the module is unchanged.
void load_module_tensors(torch::nn::Module& module, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                         const std::string& what);

}  // namespace gradaccum::models
