// Fashion-MNIST from Debian's dataset-fashion-mnist package: 60000 training and
// 10000 test images, 28×28 grey levels, 10 classes.
#pragma once

#include <torch/torch.h>

#include <string>

#include "gradaccum/core/trainable.h"

namespace gradaccum::data {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

class FashionMnist final : public core::Dataset {
 public:
  // split: "train" or "test". limit > 0 keeps the first `limit` samples.
  // Throws gradaccum::Error naming the package when the files are missing.
  FashionMnist(const std::string& directory, const std::string& split, int64_t limit = 0);

  int64_t size() const override { return labels_.size(0); }
  // input: [n, 1, 28, 28] normalized with the training set's mean and std;
  // target: [n] int64 class ids.
  core::Batch get(const torch::Tensor& indices, torch::ScalarType dtype) const override;

 private:
  torch::Tensor images_;  // uint8 [n, 1, 28, 28]
  torch::Tensor labels_;  // int64 [n]
};

}  // namespace gradaccum::data
