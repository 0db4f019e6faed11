#include "gradaccum/kernels/float32_cpu_matmuls.h"

#include <ATen/ATen.h>
#include <ATen/Version.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <atomic>
#include <mutex>

namespace gradaccum::kernels {
namespace {

// Whether the installed entries route; off, they do what libtorch's own entries do.
std::atomic<bool> g_routing{false};

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
    if (!g_routing.load(std::memory_order_relaxed)) {
      // libtorch's own entry for these ops (its lower_precision_fp policy): the operands cast to
      // 16 bits, through autocast's weight cache, and the op run in 16 bits.
      return Op(at::autocast::cached_cast(lower, args, c10::DeviceType::CPU)...);
    }
    return as_lower(Op(rounded_values(args, lower)...), lower);
  }
};

using Linear = at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&);

// Linear, routed, keeping 16-bit copies for its backward. Through the generic route above,
// autograd saves the float32 copies of the rounded operands: per layer a float32 copy of the
// whole weight, alive from the forward to the backward (1.2 GB for BLOOM-560m's blocks), and
// float32 inputs. This saves the 16-bit input and a reference to the weight, and rounds the
// weight again in the backward. Same products, same roundings: the gradients equal the generic
// route's bit for bit (tests/kernels/float32_cpu_matmuls_check.cpp). Only for the inputs that
// at::linear runs as one 2-D product (2-D, or 3-D contiguous), whose backward is the two GEMMs
// below and a sum over rows; anything else takes the generic route.
struct RoundedLinear : torch::autograd::Function<RoundedLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, bool has_bias, at::ScalarType lower) {
    auto x16 = x.to(lower);
    auto y = at::linear(x16.to(at::kFloat), rounded_values(weight, lower),
                        has_bias ? c10::optional<at::Tensor>(rounded_values(bias, lower)) : c10::nullopt);
    ctx->save_for_backward({x16, weight});
    ctx->saved_data["lower"] = static_cast<int64_t>(lower);
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.scalar_type());
    return y.to(lower);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x16 = saved[0];
    const auto& weight = saved[1];
    const auto lower = static_cast<at::ScalarType>(ctx->saved_data["lower"].toInt());
    // As the casts' backward: a gradient reaching a rounded operand is rounded to 16 bits, then
    // takes the operand's dtype.
    const auto through_casts = [lower](const at::Tensor& g, at::ScalarType dtype) { return g.to(lower).to(dtype); };
    const auto saved_dtype = [ctx](const char* key) {
      return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
    };
    const auto g = grads[0].to(at::kFloat);
    const auto g2 = g.reshape({-1, g.size(-1)});
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      dx = through_casts(g2.mm(rounded_values(weight, lower)).view(x16.sizes()), saved_dtype("x_dtype"));
    }
    if (ctx->needs_input_grad(1)) {
      dw = through_casts(g2.t().mm(x16.to(at::kFloat).reshape({-1, x16.size(-1)})), weight.scalar_type());
    }
    if (ctx->needs_input_grad(2)) db = through_casts(g2.sum(0), saved_dtype("bias_dtype"));
    return {dx, dw, db, at::Tensor(), at::Tensor()};
  }
};

bool rounds_to_16_bits(const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf;
}

at::Tensor routed_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  if (!g_routing.load(std::memory_order_relaxed)) return Routed<Linear, &at::linear>::call(x, weight, bias);
  const bool has_bias = bias.has_value() && bias->defined();
  const bool one_product = x.dim() == 2 || (x.dim() == 3 && x.is_contiguous());
  if (!one_product || weight.dim() != 2 || !rounds_to_16_bits(x) || !rounds_to_16_bits(weight) ||
      (has_bias && !rounds_to_16_bits(*bias))) {
    return Routed<Linear, &at::linear>::call(x, weight, bias);
  }
  const auto lower = at::autocast::get_autocast_dtype(at::kCPU);
  c10::impl::ExcludeDispatchKeyGuard below_autocast(c10::DispatchKey::AutocastCPU);
  // Without a bias an empty tensor stands in: a custom function's inputs must be defined.
  return RoundedLinear::apply(x, weight, has_bias ? *bias : at::empty({0}, weight.options()), has_bias, lower);
}

using TwoOperands = at::Tensor(const at::Tensor&, const at::Tensor&);
using Attention = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                             double, bool, std::optional<double>, bool);
using AddProduct = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Scalar&,
                              const at::Scalar&);
using Convolution = at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&, at::IntArrayRef,
                               at::IntArrayRef, at::IntArrayRef, int64_t);

// Replacing a registered kernel makes the dispatcher warn once per op; the
// replacement is deliberate, so those warnings are dropped.
class SilentWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

}  // namespace

void route_cpu_autocast_matmuls_through_float32(bool on) {
  if (!on) {
    g_routing = false;  // the entries, if installed, stay and run libtorch's path
    return;
  }
  static std::once_flag once;
  std::call_once(once, [] {
    SilentWarnings silent;
    c10::WarningUtils::WarningHandlerGuard quiet(&silent);
    // Kept for the life of the process: destroying it would restore the old kernels
    // while other threads may be dispatching.
    static auto* library =
        new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutocastCPU, __FILE__, __LINE__);
    library->impl("linear", TORCH_FN(routed_linear));
    library->impl("matmul", TORCH_FN((Routed<TwoOperands, &at::matmul>::call)));
    library->impl("mm", TORCH_FN((Routed<TwoOperands, &at::mm>::call)));
    library->impl("addmm", TORCH_FN((Routed<AddProduct, &at::addmm>::call)));
    library->impl("bmm", TORCH_FN((Routed<TwoOperands, &at::bmm>::call)));
    library->impl("baddbmm", TORCH_FN((Routed<AddProduct, &at::baddbmm>::call)));
    library->impl("conv1d", TORCH_FN((Routed<Convolution, &at::conv1d>::call)));
    library->impl("conv2d", TORCH_FN((Routed<Convolution, &at::conv2d>::call)));
    library->impl("scaled_dot_product_attention",
                  TORCH_FN((Routed<Attention, &at::scaled_dot_product_attention>::call)));
  });
  g_routing = true;
}

bool cpu_autocast_matmuls_route_through_float32() { return g_routing; }

}  // namespace gradaccum::kernels
