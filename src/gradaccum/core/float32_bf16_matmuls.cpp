#include "gradaccum/core/float32_bf16_matmuls.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <atomic>
#include <mutex>

namespace gradaccum::core {
namespace {

std::atomic<bool> g_installed{false};

// The value autocast would pass to a bfloat16 op, widened back to float32.
// Autocast leaves float64 (and non-floating) operands alone; so does this.
at::Tensor bf16_values(const at::Tensor& t) {
  if (!t.defined()) return t;
  const auto dtype = t.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) return t;
  return t.to(at::kBFloat16).to(at::kFloat);
}

c10::optional<at::Tensor> bf16_values(const c10::optional<at::Tensor>& t) {
  if (!t.has_value()) return t;
  return bf16_values(*t);
}

// The op's float32 result, rounded as autocast's bfloat16 op would return it.
at::Tensor as_bf16(const at::Tensor& result) {
  return result.scalar_type() == at::kFloat ? result.to(at::kBFloat16) : result;
}

// The replaced kernels run below autocast, as autocast's own do.
struct BelowAutocast {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::DispatchKey::AutocastCPU};
};

at::Tensor linear(const at::Tensor& input, const at::Tensor& weight,
                  const c10::optional<at::Tensor>& bias) {
  BelowAutocast below;
  return as_bf16(at::linear(bf16_values(input), bf16_values(weight), bf16_values(bias)));
}

at::Tensor matmul(const at::Tensor& self, const at::Tensor& other) {
  BelowAutocast below;
  return as_bf16(at::matmul(bf16_values(self), bf16_values(other)));
}

at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2) {
  BelowAutocast below;
  return as_bf16(at::mm(bf16_values(self), bf16_values(mat2)));
}

at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                 const at::Scalar& beta, const at::Scalar& alpha) {
  BelowAutocast below;
  return as_bf16(
      at::addmm(bf16_values(self), bf16_values(mat1), bf16_values(mat2), beta, alpha));
}

at::Tensor bmm(const at::Tensor& self, const at::Tensor& mat2) {
  BelowAutocast below;
  return as_bf16(at::bmm(bf16_values(self), bf16_values(mat2)));
}

at::Tensor baddbmm(const at::Tensor& self, const at::Tensor& batch1, const at::Tensor& batch2,
                   const at::Scalar& beta, const at::Scalar& alpha) {
  BelowAutocast below;
  return as_bf16(
      at::baddbmm(bf16_values(self), bf16_values(batch1), bf16_values(batch2), beta, alpha));
}

at::Tensor conv1d(const at::Tensor& input, const at::Tensor& weight,
                  const c10::optional<at::Tensor>& bias, at::IntArrayRef stride,
                  at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  BelowAutocast below;
  return as_bf16(at::conv1d(bf16_values(input), bf16_values(weight), bf16_values(bias), stride,
                            padding, dilation, groups));
}

at::Tensor conv2d(const at::Tensor& input, const at::Tensor& weight,
                  const c10::optional<at::Tensor>& bias, at::IntArrayRef stride,
                  at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  BelowAutocast below;
  return as_bf16(at::conv2d(bf16_values(input), bf16_values(weight), bf16_values(bias), stride,
                            padding, dilation, groups));
}

// Replacing a registered kernel makes the dispatcher warn once per op; the
// replacement is deliberate, so those warnings are dropped.
class SilentWarnings : public c10::WarningHandler {
 public:
  void process(const c10::SourceLocation&, const std::string&, bool) override {}
};

}  // namespace

bool routes_bf16_matmuls_through_float32(const std::string& setting, MixedPrecision precision,
                                         const torch::Device& device, bool cpu_has_avx512) {
  if (precision != MixedPrecision::bf16 || !device.is_cpu()) return false;
  return setting == "float32" || (setting == "auto" && !cpu_has_avx512);
}

void route_cpu_bf16_matmuls_through_float32() {
  static std::once_flag once;
  std::call_once(once, [] {
    SilentWarnings silent;
    c10::Warning::WarningHandlerGuard quiet(&silent);
    // Kept for the life of the process: destroying it would restore the old kernels
    // while other threads may be dispatching.
    static auto* library = new torch::Library(torch::Library::IMPL, "aten",
                                              c10::DispatchKey::AutocastCPU, __FILE__, __LINE__);
    library->impl("linear", TORCH_FN(linear));
    library->impl("matmul", TORCH_FN(matmul));
    library->impl("mm", TORCH_FN(mm));
    library->impl("addmm", TORCH_FN(addmm));
    library->impl("bmm", TORCH_FN(bmm));
    library->impl("baddbmm", TORCH_FN(baddbmm));
    library->impl("conv1d", TORCH_FN(conv1d));
    library->impl("conv2d", TORCH_FN(conv2d));
    g_installed = true;
  });
}

bool cpu_bf16_matmuls_route_through_float32() { return g_installed; }

}  // namespace gradaccum::core
