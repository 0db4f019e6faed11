// Rotary position embeddings (Su et al. 2021) with the frequency scalings Hugging Face
// transformers names (modeling_rope_utils.py): default, linear, dynamic (NTK), llama3, yarn.
//
// Head h's query and key at position p are rotated pairwise: channel i and i + D/2 by the angle
// p · inv_freq[i] (HF's rotate_half layout, not interleaved pairs), and cos and sin are multiplied
// by attention_scaling (yarn's; 1 for the others). The frequencies are computed in float64 from
// the formulas, so a float64 model gets float64 angles (transformers computes them in float32
// whatever the model's dtype; its float64 reference in tests/hf does so in float64).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "gradaccum/base/enum_names.h"

namespace gradaccum::models {

enum class RopeType { standard, linear, dynamic, llama3, yarn };

// HF's rope_type names: "default", "linear", "dynamic", "llama3", "yarn".
const base::EnumNames<RopeType>& rope_type_names();
std::string to_string(RopeType type);
// The type named `name`; anything else throws gradaccum::Error naming `what` and the choices.
RopeType parse_rope_type(const std::string& name, const std::string& what);

// HF's rope_parameters (rope_scaling) fields. 0 / nullopt: the field is absent.
struct RopeOptions {
  RopeType type = RopeType::standard;
  double theta = 10000.0;  // rope_theta
  double factor = 1.0;     // linear, dynamic, llama3, yarn
  // llama3: frequencies with wavelengths beyond original / low_freq_factor are divided by
  // factor, those below original / high_freq_factor kept, the ones between interpolated.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3 and yarn: the pretraining context (0: max_position_embeddings, as HF defaults it).
  int64_t original_max_position_embeddings = 0;
  // yarn's optional fields (HF's defaults when absent: beta_fast 32, beta_slow 1, attention_factor
  // from mscale / mscale_all_dim or 0.1 ln(factor) + 1, truncate true).
  std::optional<double> attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim;
  bool truncate = true;
};

struct RopeFrequencies {
  torch::Tensor inv_freq;          // [head_dim / 2] float64
  double attention_scaling = 1.0;  // cos and sin are multiplied by it
};

// The inverse frequencies of `options` for heads of `head_dim` channels (even). `seq_len` is the
// sequence length dynamic scaling adapts to (HF: the batch's largest position + 1, never less than
// max_position_embeddings); the other types ignore it. Throws gradaccum::Error on an odd head_dim
// or a factor that is not positive.
RopeFrequencies rope_frequencies(const RopeOptions& options, int64_t head_dim, int64_t max_position_embeddings,
                                 int64_t seq_len = 0);

// cos and sin [B, T, head_dim] in `dtype` for positions [B, T] (integers): the angles
// positions · inv_freq in float64, duplicated over both halves, times attention_scaling.
std::pair<torch::Tensor, torch::Tensor> rope_cos_sin(const RopeFrequencies& frequencies, const torch::Tensor& positions,
                                                     torch::ScalarType dtype);

// x [B, H, T, D] rotated: x · cos + rotate_half(x) · sin, cos and sin [B, T, D] (rope_cos_sin),
// where rotate_half(x) = [-x[D/2:], x[:D/2]].
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace gradaccum::models
