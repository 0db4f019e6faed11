// One LoRA adapter on a Linear layer: the term scaling · B(A(dropout(x))) that models::linear
// (linear.h) adds to the layer's output. What attaches adapters, saves and loads them is lora.h.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "gradaccum/models/sample_dropout.h"

namespace gradaccum::models {

// One adapter: scaling · lora_B(lora_A(dropout(x))). Registered on the adapted layer as `lora`
// (it has no parameters of its own; lora_A and lora_B are registered beside it).
class LoraAdapterImpl : public torch::nn::Module {
 public:
  LoraAdapterImpl(torch::nn::Linear lora_A, torch::nn::Linear lora_B, double scaling, double dropout, int64_t site,
                  DropoutRng rng);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear lora_A, lora_B;
  SampleDropout dropout{nullptr};
  double scaling;
};
TORCH_MODULE(LoraAdapter);

// The adapter attached to `layer`, or null (a plain layer has no children: this costs nothing).
LoraAdapterImpl* lora_adapter_of(const torch::nn::LinearImpl& layer);

}  // namespace gradaccum::models
