// Padded token batches for the decoder tests (bloom_test, classifier_test):
// random sequences, left or right padding with its attention mask, and one
// window accumulated through the engine's LossNormalizer with that mask.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "gradaccum/core/loss_normalizer.h"
#include "gradaccum/core/trainable.h"
#include "test_support.h"

namespace gradaccum::testing {

inline constexpr int64_t kPadId = 0;  // any id works: the mask, not the id, marks padding

// Random real tokens in [1, vocab) (never the pad id) of each length, from `seed`.
inline std::vector<torch::Tensor> make_sequences(const std::vector<int64_t>& lengths, uint64_t seed,
                                                 int64_t vocab = 64) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<torch::Tensor> sequences;
  for (auto n : lengths) sequences.push_back(torch::randint(1, vocab, {n}, generator, torch::kLong));
  return sequences;
}

struct Padded {
  torch::Tensor ids;   // [B, T] int64
  torch::Tensor mask;  // [B, T] int64, 1 = real token
};

// Pads every sequence to `width` (at least the longest) on the left or right.
inline Padded pad(const std::vector<torch::Tensor>& sequences, bool left, int64_t width = 0) {
  for (const auto& s : sequences) width = std::max(width, s.size(0));
  const auto rows = static_cast<int64_t>(sequences.size());
  Padded p{torch::full({rows, width}, kPadId, torch::kLong), torch::zeros({rows, width}, torch::kLong)};
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t n = sequences[i].size(0);
    const int64_t begin = left ? width - n : 0;
    p.ids[i].slice(0, begin, begin + n).copy_(sequences[i]);
    p.mask[i].slice(0, begin, begin + n).fill_(1);
  }
  return p;
}

// testing::accumulate_window with an attention mask: one window over
// consecutive row ranges of sizes `splits` in the Trainer's order (objective →
// backward per micro-batch, then finish). Returns the window loss.
inline double accumulate_padded_window(core::Trainable& model, const Padded& data, const torch::Tensor& targets,
                                       const std::vector<int64_t>& splits, core::LossNormalization mode,
                                       int64_t accumulation_steps) {
  zero_grads(model.module());
  core::LossNormalizer normalizer(mode, accumulation_steps);
  normalizer.begin_window();
  int64_t begin = 0;
  for (auto n : splits) {
    core::Batch batch{data.ids.slice(0, begin, begin + n), targets.slice(0, begin, begin + n),
                      data.mask.slice(0, begin, begin + n), n};
    normalizer.objective(model.loss(batch)).backward();
    begin += n;
  }
  return normalizer.finish(normalizer.local_totals(), parameter_grads(model.module()), 1).loss.item<double>();
}

}  // namespace gradaccum::testing
