// Builds the optimizers (libtorch's SGD with momentum/Nesterov; AdamW through
// libtorch's fused AdamW op, optim/fused_adamw.h) from the
// configuration and sets their learning rate.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "gradaccum/base/enum_names.h"

namespace gradaccum::optim {

enum class OptimizerType { adamw, sgd };
const base::EnumNames<OptimizerType>& optimizer_type_names();  // the config key optim
std::string to_string(OptimizerType type);

struct OptimizerSpec {
  OptimizerType type = OptimizerType::adamw;
  double learning_rate = 2e-3;
  double weight_decay = 0.0;
  double momentum = 0.0;  // sgd
  bool nesterov = false;  // sgd
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
};

// Whether weight decay applies to `param`: to matrices and embeddings (2 or more dimensions),
// not to biases and normalization gains. The same split as HF's Trainer for GPT-2 and BLOOM
// (which decides by module type and name), nanoGPT and llm.c (by dimension).
bool takes_weight_decay(const torch::Tensor& param);

// With weight decay, two param groups: the parameters that take it (decayed[i], by default
// takes_weight_decay(params[i])) and the others with weight_decay 0; a sharded optimizer passes
// the answers for the parameters its flat shards come from.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec, std::vector<torch::Tensor> params,
                                                        std::vector<bool> decayed = {});

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace gradaccum::optim
