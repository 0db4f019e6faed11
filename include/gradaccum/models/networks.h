// The networks of the image workload and of seed 000, as plain Sequentials, and seed 000's MLP as
// one module whose forward is one kernel call.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "gradaccum/kernels/gelu_mlp.h"
#include "gradaccum/models/memory_format.h"
#include "gradaccum/models/norm.h"
#include "gradaccum/models/sample_dropout.h"

namespace gradaccum::models {

// Linear → GELU → Linear as one module: forward is kernels::gelu_mlp, one fused autograd node
// on small CPU inputs and libtorch's layers elsewhere (kernels/gelu_mlp.h).
class GeluMlpImpl : public torch::nn::Module {
 public:
  // Parameters are named as in the Sequential Linear(in, hidden) → GELU →
  // Linear(hidden, out): "0.weight", "0.bias", "2.weight", "2.bias", and
  // initialized as those Linear layers are.
  GeluMlpImpl(int64_t in_features, int64_t hidden_features, int64_t out_features);

  // x: [rows, in] → [rows, out]; GELU is the exact (erf) one.
  torch::Tensor forward(const torch::Tensor& x);

  // Whether forward(x) takes the fused path (public for tests and benchmarks).
  bool fuses(const torch::Tensor& x) const;

  // Largest rows × (in × hidden + hidden × out) the fused path takes.
  static constexpr int64_t kMaxFusedMultiplyAdds = kernels::kGeluMlpMaxFusedMultiplyAdds;

  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(GeluMlp);

// Seed 000's MLP, Linear(16, 32) → GELU → Linear(32, 1), as a GeluMlp.
GeluMlp seed000_mlp();

// Seed 000's networks as plain Sequentials of libtorch layers: the MLP above,
// or with `batch_norm` its variant Linear(16, 32) → BatchNorm1d(32) → Linear(32, 1).
// Parameter names ("0.weight", ...) are those of seed000_mlp().
torch::nn::Sequential seed000_sequential_mlp(bool batch_norm = false);

// Image MLP: flatten → [Linear → norm → ReLU] per hidden width → Linear(classes).
torch::nn::Sequential image_mlp(int64_t in_features, const std::vector<int64_t>& hidden, int64_t classes, NormKind norm,
                                int64_t groups);

// Small CNN for 28×28 grey images: per entry of `channels`, a 3×3 conv → norm →
// ReLU → 2×2 max-pool; then flatten → Linear(hidden) → ReLU → Linear(classes). With `dropout`
// > 0, dropout (sample_dropout.h, site 0) after the dense layer's ReLU, as module drop_fc.
// The activations are laid out by `format` (memory_format.h; module "memory_format" first).
torch::nn::Sequential small_cnn(const std::vector<int64_t>& channels, int64_t hidden, int64_t classes, NormKind norm,
                                int64_t groups, double dropout = 0.0, DropoutRng dropout_rng = DropoutRng::per_sample,
                                MemoryFormat format = MemoryFormat::automatic);

// Small ResNet: 3×3 stem conv, one basic residual block per entry of
// `channels` (stride 2 from the second on), global average pool, Linear(classes); activations
// laid out by `format`, as in small_cnn.
torch::nn::Sequential small_resnet(const std::vector<int64_t>& channels, int64_t classes, NormKind norm, int64_t groups,
                                   MemoryFormat format = MemoryFormat::automatic);

}  // namespace gradaccum::models
