#include "gradaccum/models/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gradaccum/base/check.h"

namespace gradaccum::models {

namespace {

torch::Tensor even_channels(int64_t head_dim) {
  return torch::arange(0, head_dim, 2, torch::kDouble) / static_cast<double>(head_dim);
}

// 1 / theta^(2i / D), i = 0 .. D/2 - 1.
torch::Tensor standard_inv_freq(double theta, int64_t head_dim) {
  return 1.0 / torch::pow(theta, even_channels(head_dim));
}

// yarn's attention scaling for a context stretched by `scale` (1 below 1).
double yarn_mscale(double scale, double mscale = 1.0) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The (fractional) channel index at which a frequency completes `rotations` turns over
// `context` positions.
double yarn_correction_dim(double rotations, int64_t head_dim, double theta, int64_t context) {
  return static_cast<double>(head_dim) * std::log(static_cast<double>(context) / (rotations * 2.0 * M_PI)) /
         (2.0 * std::log(theta));
}

}  // namespace

const base::EnumNames<RopeType>& rope_type_names() {
  static const base::EnumNames<RopeType> names{{RopeType::standard, "default"},
                                               {RopeType::linear, "linear"},
                                               {RopeType::dynamic, "dynamic"},
                                               {RopeType::llama3, "llama3"},
                                               {RopeType::yarn, "yarn"}};
  return names;
}

std::string to_string(RopeType type) { return rope_type_names().name(type); }

RopeType parse_rope_type(const std::string& name, const std::string& what) {
  if (const auto type = rope_type_names().find(name)) return *type;
  throw Error(fmt::format("{}: rope_type \"{}\" is not supported (supported: {})", what, name,
                          fmt::join(rope_type_names().names(), ", ")));
}

RopeFrequencies rope_frequencies(const RopeOptions& options, int64_t head_dim, int64_t max_position_embeddings,
                                 int64_t seq_len) {
  GA_CHECK(head_dim > 0 && head_dim % 2 == 0, "RoPE: head_dim must be even and positive, got {}", head_dim);
  GA_CHECK(options.theta > 0, "RoPE: rope_theta must be positive, got {}", options.theta);
  GA_CHECK(options.type == RopeType::standard || options.factor > 0, "RoPE: {} scaling needs a positive factor, got {}",
           to_string(options.type), options.factor);
  const int64_t original =
      options.original_max_position_embeddings > 0 ? options.original_max_position_embeddings : max_position_embeddings;
  RopeFrequencies out;
  switch (options.type) {
    case RopeType::standard:
      out.inv_freq = standard_inv_freq(options.theta, head_dim);
      break;
    case RopeType::linear:
      // Positions divided by factor, written as the frequencies divided by it.
      out.inv_freq = standard_inv_freq(options.theta, head_dim) / options.factor;
      break;
    case RopeType::dynamic: {
      // NTK-aware: beyond max_position_embeddings the base grows with the sequence.
      const double length = static_cast<double>(std::max(seq_len, max_position_embeddings));
      const double d = static_cast<double>(head_dim);
      const double theta =
          options.theta *
          std::pow(options.factor * length / static_cast<double>(max_position_embeddings) - (options.factor - 1.0),
                   d / (d - 2.0));
      out.inv_freq = standard_inv_freq(theta, head_dim);
      break;
    }
    case RopeType::llama3: {
      GA_CHECK(options.high_freq_factor != options.low_freq_factor,
               "RoPE: llama3 scaling needs high_freq_factor != low_freq_factor, both are {}", options.low_freq_factor);
      const auto inv_freq = standard_inv_freq(options.theta, head_dim);
      const double context = static_cast<double>(original);
      const double low_freq_wavelen = context / options.low_freq_factor;
      const double high_freq_wavelen = context / options.high_freq_factor;
      const auto wavelen = 2.0 * M_PI / inv_freq;
      // Long wavelengths are divided by factor, short ones kept, the band between interpolated.
      auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / options.factor, inv_freq);
      const auto smooth =
          (context / wavelen - options.low_freq_factor) / (options.high_freq_factor - options.low_freq_factor);
      const auto smoothed = (1.0 - smooth) * scaled / options.factor + smooth * scaled;
      const auto medium = wavelen.ge(high_freq_wavelen).logical_and(wavelen.le(low_freq_wavelen));
      out.inv_freq = torch::where(medium, smoothed, scaled);
      break;
    }
    case RopeType::yarn: {
      const double factor = options.factor;
      if (options.attention_factor) {
        out.attention_scaling = *options.attention_factor;
      } else if (options.mscale.value_or(0.0) != 0.0 && options.mscale_all_dim.value_or(0.0) != 0.0) {
        out.attention_scaling = yarn_mscale(factor, *options.mscale) / yarn_mscale(factor, *options.mscale_all_dim);
      } else {
        out.attention_scaling = yarn_mscale(factor);
      }
      const double beta_fast = options.beta_fast.value_or(0.0) != 0.0 ? *options.beta_fast : 32.0;
      const double beta_slow = options.beta_slow.value_or(0.0) != 0.0 ? *options.beta_slow : 1.0;
      double low = yarn_correction_dim(beta_fast, head_dim, options.theta, original);
      double high = yarn_correction_dim(beta_slow, head_dim, options.theta, original);
      if (options.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(head_dim - 1));
      if (low == high) high += 0.001;  // as HF: no division by zero
      const auto pos_freqs = torch::pow(options.theta, even_channels(head_dim));
      const auto extrapolation = 1.0 / pos_freqs;
      const auto interpolation = 1.0 / (factor * pos_freqs);
      const auto ramp = ((torch::arange(head_dim / 2, torch::kDouble) - low) / (high - low)).clamp(0.0, 1.0);
      const auto extrapolated = 1.0 - ramp;  // 1: the channel keeps its frequency
      out.inv_freq = interpolation * (1.0 - extrapolated) + extrapolation * extrapolated;
      break;
    }
  }
  return out;
}

std::pair<torch::Tensor, torch::Tensor> rope_cos_sin(const RopeFrequencies& frequencies, const torch::Tensor& positions,
                                                     torch::ScalarType dtype) {
  const auto inv_freq = frequencies.inv_freq.to(positions.device());
  const auto angles = positions.to(torch::kDouble).unsqueeze(-1) * inv_freq;  // [B, T, D/2]
  const auto both = torch::cat({angles, angles}, -1);
  auto cos = both.cos(), sin = both.sin();
  if (frequencies.attention_scaling != 1.0) {
    cos = cos * frequencies.attention_scaling;
    sin = sin * frequencies.attention_scaling;
  }
  return {cos.to(dtype), sin.to(dtype)};
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  const auto c = cos.unsqueeze(1), s = sin.unsqueeze(1);  // over the heads
  return x * c + rotated * s;
}

}  // namespace gradaccum::models
