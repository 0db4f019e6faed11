#include "gradaccum/core/float32_bf16_matmuls.h"

#include <ATen/ATen.h>
#include <ATen/Version.h>
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

// Arguments that are not tensors (scalars, sizes, groups) pass through.
template <typename T>
const T& bf16_values(const T& x) {
  return x;
}

// The op's float32 result, rounded as autocast's bfloat16 op would return it.
at::Tensor as_bf16(const at::Tensor& result) {
  return result.scalar_type() == at::kFloat ? result.to(at::kBFloat16) : result;
}

// The replacement of autocast's kernel for `Op` (of type `Signature`): below
// autocast, as autocast's own kernels run, Op on the operands' bfloat16 values
// in float32, the result rounded to bfloat16.
template <typename Signature, Signature* Op>
struct Routed;

template <typename... Args, at::Tensor (*Op)(Args...)>
struct Routed<at::Tensor(Args...), Op> {
  static at::Tensor call(Args... args) {
    c10::impl::ExcludeDispatchKeyGuard below_autocast(c10::DispatchKey::AutocastCPU);
    return as_bf16(Op(bf16_values(args)...));
  }
};

using TwoOperands = at::Tensor(const at::Tensor&, const at::Tensor&);
using AddProduct = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Scalar&, const at::Scalar&);
using Linear = at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&);
using Convolution = at::Tensor(const at::Tensor&, const at::Tensor&,
                               const c10::optional<at::Tensor>&, at::IntArrayRef, at::IntArrayRef,
                               at::IntArrayRef, int64_t);

// Replacing a registered kernel makes the dispatcher warn once per op; the
// replacement is deliberate, so those warnings are dropped.
class SilentWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

}  // namespace

bool cpu_has_avx512() { return at::get_cpu_capability() == "AVX512"; }

bool routes_bf16_matmuls_through_float32(const std::string& setting, MixedPrecision precision,
                                         const torch::Device& device, bool cpu_has_avx512) {
  if (precision != MixedPrecision::bf16 || !device.is_cpu()) return false;
  return setting == "float32" || (setting == "auto" && !cpu_has_avx512);
}

void route_cpu_bf16_matmuls_through_float32() {
  static std::once_flag once;
  std::call_once(once, [] {
    SilentWarnings silent;
    c10::WarningUtils::WarningHandlerGuard quiet(&silent);
    // Kept for the life of the process: destroying it would restore the old kernels
    // while other threads may be dispatching.
    static auto* library = new torch::Library(torch::Library::IMPL, "aten",
                                              c10::DispatchKey::AutocastCPU, __FILE__, __LINE__);
    library->impl("linear", TORCH_FN((Routed<Linear, &at::linear>::call)));
    library->impl("matmul", TORCH_FN((Routed<TwoOperands, &at::matmul>::call)));
    library->impl("mm", TORCH_FN((Routed<TwoOperands, &at::mm>::call)));
    library->impl("addmm", TORCH_FN((Routed<AddProduct, &at::addmm>::call)));
    library->impl("bmm", TORCH_FN((Routed<TwoOperands, &at::bmm>::call)));
    library->impl("baddbmm", TORCH_FN((Routed<AddProduct, &at::baddbmm>::call)));
    library->impl("conv1d", TORCH_FN((Routed<Convolution, &at::conv1d>::call)));
    library->impl("conv2d", TORCH_FN((Routed<Convolution, &at::conv2d>::call)));
    g_installed = true;
  });
}

bool cpu_bf16_matmuls_route_through_float32() { return g_installed; }

}  // namespace gradaccum::core
