#include "gradaccum/core/float32_cpu_matmuls.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__clang__) && __clang_major__ < 16
#include <cpuid.h>
#endif

#include <ATen/ATen.h>
#include <ATen/Version.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <atomic>
#include <mutex>

namespace gradaccum::core {
namespace {

std::atomic<bool> g_installed{false};

// The value autocast would pass to a 16-bit op, widened back to float32.
// Autocast leaves float64 (and non-floating) operands alone; so does this.
at::Tensor rounded_values(const at::Tensor& t, at::ScalarType lower) {
  if (!t.defined()) return t;
  const auto dtype = t.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) return t;
  return t.to(lower).to(at::kFloat);
}

c10::optional<at::Tensor> rounded_values(const c10::optional<at::Tensor>& t, at::ScalarType lower) {
  if (!t.has_value()) return t;
  return rounded_values(*t, lower);
}

// Arguments that are not tensors (scalars, sizes, groups) pass through.
template <typename T>
const T& rounded_values(const T& x, at::ScalarType) {
  return x;
}

// The op's float32 result, rounded as autocast's 16-bit op would return it.
at::Tensor as_lower(const at::Tensor& result, at::ScalarType lower) {
  return result.scalar_type() == at::kFloat ? result.to(lower) : result;
}

// The replacement of autocast's kernel for `Op` (of type `Signature`): below
// autocast, as autocast's own kernels run, Op on the operands' 16-bit values
// in float32, the result rounded to 16 bits.
template <typename Signature, Signature* Op>
struct Routed;

template <typename... Args, at::Tensor (*Op)(Args...)>
struct Routed<at::Tensor(Args...), Op> {
  static at::Tensor call(Args... args) {
    // The region's dtype: thread-local, read where autocast's own kernels read it.
    const auto lower = at::autocast::get_autocast_dtype(at::kCPU);
    c10::impl::ExcludeDispatchKeyGuard below_autocast(c10::DispatchKey::AutocastCPU);
    return as_lower(Op(rounded_values(args, lower)...), lower);
  }
};

using TwoOperands = at::Tensor(const at::Tensor&, const at::Tensor&);
using AddProduct = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Scalar&,
                              const at::Scalar&);
using Linear = at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&);
using Convolution = at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&, at::IntArrayRef,
                               at::IntArrayRef, at::IntArrayRef, int64_t);

// Replacing a registered kernel makes the dispatcher warn once per op; the
// replacement is deliberate, so those warnings are dropped.
class SilentWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

}  // namespace

#if (defined(__x86_64__) || defined(__i386__)) && defined(__clang__) && __clang_major__ < 16
// Clang before 16 knows neither "amx-bf16" nor "avx512fp16" in __builtin_cpu_supports (the fuzz
// build compiles this file with clang 14): read CPUID leaf 7 instead. Both bits need the OS's
// AVX-512 state, which XCR0 bits 5-7 (opmask, ZMM) report.
namespace {
bool cpuid7_bit(unsigned subleaf, int reg, int bit) {
  unsigned r[4] = {0, 0, 0, 0};
  if (__get_cpuid_count(7, subleaf, &r[0], &r[1], &r[2], &r[3]) == 0) return false;
  return ((r[reg] >> bit) & 1U) != 0;
}
bool os_saves_avx512_state() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || ((ecx >> 27) & 1U) == 0) return false;  // OSXSAVE
  unsigned xcr0 = 0, high = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0), "=d"(high) : "c"(0));  // XCR0 (no -mxsave needed)
  return (xcr0 & 0xe6) == 0xe6;
}
}  // namespace

bool cpu_has_native_bf16() {
  // AVX512_BF16: leaf 7.1 EAX bit 5; AMX-BF16: leaf 7.0 EDX bit 22.
  return os_saves_avx512_state() && (cpuid7_bit(1, 0, 5) || cpuid7_bit(0, 3, 22));
}

bool cpu_has_native_fp16() {
  return os_saves_avx512_state() && cpuid7_bit(0, 3, 23);  // AVX512_FP16: leaf 7.0 EDX bit 23
}
#else
bool cpu_has_native_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
#else
  return false;  // not known here: float32 GEMMs are the safe choice
#endif
}

bool cpu_has_native_fp16() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx512fp16");
#else
  return false;
#endif
}
#endif

bool routes_cpu_matmuls_through_float32(const std::string& bf16_setting, MixedPrecision precision,
                                        const torch::Device& device, bool cpu_has_native_bf16,
                                        bool cpu_has_native_fp16) {
  if (!device.is_cpu()) return false;
  switch (precision) {
    case MixedPrecision::bf16:
      return bf16_setting == "float32" || (bf16_setting == "auto" && !cpu_has_native_bf16);
    case MixedPrecision::fp16:
      return !cpu_has_native_fp16;
    case MixedPrecision::none:
      break;
  }
  return false;
}

void route_cpu_autocast_matmuls_through_float32() {
  static std::once_flag once;
  std::call_once(once, [] {
    SilentWarnings silent;
    c10::WarningUtils::WarningHandlerGuard quiet(&silent);
    // Kept for the life of the process: destroying it would restore the old kernels
    // while other threads may be dispatching.
    static auto* library =
        new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutocastCPU, __FILE__, __LINE__);
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

bool cpu_autocast_matmuls_route_through_float32() { return g_installed; }

}  // namespace gradaccum::core
