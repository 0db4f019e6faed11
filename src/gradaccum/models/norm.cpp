#include "gradaccum/models/norm.h"

#include <numeric>

#include "gradaccum/base/check.h"
#include "gradaccum/kernels/group_norm.h"

namespace gradaccum::models {

const base::EnumNames<NormKind>& norm_kind_names() {
  static const base::EnumNames<NormKind> names{
      {NormKind::batch, "batch"}, {NormKind::group, "group"}, {NormKind::layer, "layer"}, {NormKind::none, "none"}};
  return names;
}

std::string to_string(NormKind kind) { return norm_kind_names().name(kind); }

namespace {
int64_t dividing_groups(int64_t channels, int64_t groups) { return std::gcd(channels, std::max<int64_t>(1, groups)); }

// GroupNorm and LayerNorm that normalize in their parameters' dtype. CUDA
// autocast runs these norms in float32; CPU autocast in libtorch 1.13 leaves
// them out and then fails on a bfloat16 input with float32 affine parameters
// ("expected scalar type BFloat16 but found Float"). Without autocast the cast
// is a no-op. Subclasses keep the parameter names (weight, bias).
class GroupNormInParamDtypeImpl : public torch::nn::GroupNormImpl {
 public:
  using torch::nn::GroupNormImpl::GroupNormImpl;
  torch::Tensor forward(const torch::Tensor& x) {
    return kernels::group_norm(x.to(weight.scalar_type()), options.num_groups(), weight, bias, options.eps());
  }
};
TORCH_MODULE(GroupNormInParamDtype);

class LayerNormInParamDtypeImpl : public torch::nn::LayerNormImpl {
 public:
  using torch::nn::LayerNormImpl::LayerNormImpl;
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::nn::LayerNormImpl::forward(x.to(weight.scalar_type()));
  }
};
TORCH_MODULE(LayerNormInParamDtype);
}  // namespace

torch::nn::AnyModule make_norm2d(NormKind kind, int64_t channels, int64_t groups) {
  switch (kind) {
    case NormKind::batch:
      return torch::nn::AnyModule(torch::nn::BatchNorm2d(channels));
    case NormKind::group:
      return torch::nn::AnyModule(
          GroupNormInParamDtype(torch::nn::GroupNormOptions(dividing_groups(channels, groups), channels)));
    case NormKind::layer:
      return torch::nn::AnyModule(GroupNormInParamDtype(torch::nn::GroupNormOptions(1, channels)));
    case NormKind::none:
      break;
  }
  return torch::nn::AnyModule(torch::nn::Identity());
}

torch::nn::AnyModule make_norm1d(NormKind kind, int64_t features, int64_t groups) {
  switch (kind) {
    case NormKind::batch:
      return torch::nn::AnyModule(torch::nn::BatchNorm1d(features));
    case NormKind::group:
      return torch::nn::AnyModule(
          GroupNormInParamDtype(torch::nn::GroupNormOptions(dividing_groups(features, groups), features)));
    case NormKind::layer:
      return torch::nn::AnyModule(LayerNormInParamDtype(torch::nn::LayerNormOptions({features})));
    case NormKind::none:
      break;
  }
  return torch::nn::AnyModule(torch::nn::Identity());
}

}  // namespace gradaccum::models
