// Dropout that does not depend on the decomposition of the global batch.
//
// libtorch's dropout draws each micro-batch's mask from one generator stream, so a sample's mask
// depends on which micro-batch it lands in and what ran before: the same window cut as 32 × 1 or
// 8 × 4 trains differently, and no decomposition-invariance can be claimed with dropout on. Here
// the keep/drop decision of element e of sample s at dropout site l of optimizer step t is a pure
// function of (seed, t, s, l, e): a counter-based generator, splitmix64's finalizer applied to a
// key made of those numbers (Steele, Lea & Flood 2014: SplitMix is a counter-based generator
// whose output function is a strong 64-bit mixer). It runs as elementwise tensor operations on
// the activations' device, the same bits on every device.
//
// Element e is the element's position within its sample, counted with a fixed radix of 2^16 per
// dimension (not the tensor's sizes), so a token's mask does not change with the micro-batch's
// padded length: [B, T, C] → t·2^16 + c; [B, H, T, T] → (h·2^16 + q)·2^16 + k.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradaccum/base/enum_names.h"
#include "gradaccum/core/batch.h"

namespace gradaccum::models {

// model.dropout_rng: the generator behind a model's dropout.
enum class DropoutRng {
  per_sample,  // the counter-based masks above (default)
  libtorch,    // torch::dropout's generator: for comparison; depends on the decomposition
};
// "per_sample" | "libtorch" (model.dropout_rng).
const base::EnumNames<DropoutRng>& dropout_rng_names();
std::string to_string(DropoutRng rng);

// The per-sample mask of `x` [B, d1, …, dk] (1 ≤ k ≤ 3, each d ≤ 65536): 1 / (1 - p) where kept,
// 0 where dropped, in x's dtype and on x's device. keys.ids must hold B sample indices.
torch::Tensor per_sample_dropout_scale(const torch::Tensor& x, double p, const core::SampleKeys& keys, int64_t site);

// One dropout site of a model (HF's nn.Dropout modules: GPT-2's drop, attn_dropout,
// resid_dropout; BLOOM's dropout_add). A module without parameters, so checkpoints do not see it.
// The task sets every site's keys before its forward (SampleDropoutSites); the keys stay until the
// next micro-batch's, so a checkpointed block recomputed in the backward draws the same masks.
class SampleDropoutImpl : public torch::nn::Module {
 public:
  // p in [0, 1); `site` numbers the sites of one model (part of the mask's key).
  SampleDropoutImpl(double p, int64_t site, DropoutRng rng);
  // x unchanged in eval mode or when p = 0; else x times its mask.
  torch::Tensor forward(const torch::Tensor& x);
  double p() const { return p_; }
  void set_keys(const core::SampleKeys& keys) { keys_ = keys; }

 private:
  double p_;
  int64_t site_;
  DropoutRng rng_;
  core::SampleKeys keys_;
};
TORCH_MODULE(SampleDropout);

// A model's SampleDropout modules, found once when its task is built; before each forward the
// task hands them the micro-batch's keys (no walk over the module tree per micro-step).
class SampleDropoutSites {
 public:
  explicit SampleDropoutSites(torch::nn::Module& model);
  void set_keys(const core::SampleKeys& keys) const;

 private:
  std::vector<std::shared_ptr<SampleDropoutImpl>> sites_;
};

// Throws gradaccum::Error naming `key` unless 0 ≤ p < 1.
void check_dropout_probability(const std::string& key, double p);

}  // namespace gradaccum::models
