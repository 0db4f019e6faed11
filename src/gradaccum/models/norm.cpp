#include "gradaccum/models/norm.h"

#include <numeric>

#include "gradaccum/core/check.h"

namespace gradaccum::models {

NormKind parse_norm_kind(const std::string& name) {
  if (name == "batch") return NormKind::batch;
  if (name == "group") return NormKind::group;
  if (name == "layer") return NormKind::layer;
  if (name == "none") return NormKind::none;
  throw Error(fmt::format("model.norm: unknown norm '{}' (batch | group | layer | none)", name));
}

std::string to_string(NormKind kind) {
  switch (kind) {
    case NormKind::batch: return "batch";
    case NormKind::group: return "group";
    case NormKind::layer: return "layer";
    case NormKind::none: return "none";
  }
  return "?";
}

namespace {
int64_t dividing_groups(int64_t channels, int64_t groups) {
  return std::gcd(channels, std::max<int64_t>(1, groups));
}
}  // namespace

torch::nn::AnyModule make_norm2d(NormKind kind, int64_t channels, int64_t groups) {
  switch (kind) {
    case NormKind::batch: return torch::nn::AnyModule(torch::nn::BatchNorm2d(channels));
    case NormKind::group:
      return torch::nn::AnyModule(
          torch::nn::GroupNorm(torch::nn::GroupNormOptions(dividing_groups(channels, groups), channels)));
    case NormKind::layer:
      return torch::nn::AnyModule(torch::nn::GroupNorm(torch::nn::GroupNormOptions(1, channels)));
    case NormKind::none: break;
  }
  return torch::nn::AnyModule(torch::nn::Identity());
}

torch::nn::AnyModule make_norm1d(NormKind kind, int64_t features, int64_t groups) {
  switch (kind) {
    case NormKind::batch: return torch::nn::AnyModule(torch::nn::BatchNorm1d(features));
    case NormKind::group:
      return torch::nn::AnyModule(torch::nn::GroupNorm(
          torch::nn::GroupNormOptions(dividing_groups(features, groups), features)));
    case NormKind::layer:
      return torch::nn::AnyModule(
          torch::nn::LayerNorm(torch::nn::LayerNormOptions({features})));
    case NormKind::none: break;
  }
  return torch::nn::AnyModule(torch::nn::Identity());
}

}  // namespace gradaccum::models
