#include "gradaccum/kernels/gelu_mlp.h"

#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "gradaccum/kernels/custom_kernels.h"

namespace gradaccum::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Exact GELU and its derivative: x Φ(x) and Φ(x) + x φ(x), Φ and φ the normal
// distribution's CDF and density (the formulas of ATen's GeluType::None).
struct Gelu {
  double value;
  double slope;
};
inline double normal_cdf(double x) { return 0.5 * (1.0 + std::erf(x * M_SQRT1_2)); }
inline double gelu_value(double x) { return x * normal_cdf(x); }
inline Gelu gelu(double x) {
  const double cdf = normal_cdf(x);
  const double pdf = std::exp(-0.5 * x * x) * (M_2_SQRTPI * M_SQRT1_2 * 0.5);  // 1/√(2π)
  return {x * cdf, cdf + x * pdf};
}

// Sizes of the product: x [rows, in], W1 [hidden, in], W2 [out, hidden].
struct Shapes {
  int64_t rows, in, hidden, out;
};

// Forward in plain loops, accumulating in double: h = x W1ᵀ + b1, y = gelu(h) W2ᵀ + b2.
// Hand-written because no library here does a whole tiny MLP without a
// per-operator cost that is larger than its arithmetic (see the header).
template <typename T>
void forward_loops(const T* x, const T* w1, const T* b1, const T* w2, const T* b2, T* h, T* y, const Shapes& s) {
  c10::SmallVector<double, 16> acc(static_cast<size_t>(s.out));
  for (int64_t i = 0; i < s.rows; ++i) {
    const T* xi = x + i * s.in;
    for (int64_t o = 0; o < s.out; ++o) acc[o] = b2[o];
    for (int64_t j = 0; j < s.hidden; ++j) {
      const T* w1j = w1 + j * s.in;
      double pre = b1[j];
      for (int64_t k = 0; k < s.in; ++k) pre += static_cast<double>(xi[k]) * w1j[k];
      h[i * s.hidden + j] = static_cast<T>(pre);
      // The activation of the rounded pre-activation, as the unfused path computes it.
      const double a = gelu_value(static_cast<T>(pre));
      for (int64_t o = 0; o < s.out; ++o) acc[o] += a * w2[o * s.hidden + j];
    }
    for (int64_t o = 0; o < s.out; ++o) y[i * s.out + o] = static_cast<T>(acc[o]);
  }
}

// target[k] = Σ_r coefficient[r · coefficient_stride] · rows[r · row_stride + k]
// for k < length, summed in double: every weight gradient and the input's
// gradient is such a combination of contiguous rows, so the innermost loop
// runs along memory.
template <typename C, typename R, typename T>
void combine_rows(int64_t count, const C* coefficient, int64_t coefficient_stride, const R* rows, int64_t row_stride,
                  int64_t length, double* scratch, T* target) {
  std::fill(scratch, scratch + length, 0.0);
  for (int64_t r = 0; r < count; ++r) {
    const double c = coefficient[r * coefficient_stride];
    const R* row = rows + r * row_stride;
    for (int64_t k = 0; k < length; ++k) scratch[k] += c * row[k];
  }
  for (int64_t k = 0; k < length; ++k) target[k] = static_cast<T>(scratch[k]);
}

// Backward in plain loops, accumulating in double; gx only when wanted. First
// the activation and the gradient at the pre-activation of every row, then
// the gradients as combinations of rows.
template <typename T>
void backward_loops(const T* x, const T* w1, const T* w2, const T* h, const T* gy, T* gx, T* gw1, T* gb1, T* gw2,
                    T* gb2, const Shapes& s) {
  const int64_t n = s.rows * s.hidden;
  // The activations, then the gradients at the pre-activations: one heap block, which costs
  // less than any of the five output tensors (a SmallVector of doubles sized at run time
  // trips GCC 12's -Wmaybe-uninitialized inside c10's grow path).
  std::vector<double> rows_buffer(static_cast<size_t>(2 * n));
  double* const act = rows_buffer.data();
  double* const grad_h = act + n;
  for (int64_t i = 0; i < s.rows; ++i) {
    for (int64_t j = 0; j < s.hidden; ++j) {
      const Gelu g = gelu(h[i * s.hidden + j]);
      double grad_a = 0.0;
      for (int64_t o = 0; o < s.out; ++o) grad_a += static_cast<double>(gy[i * s.out + o]) * w2[o * s.hidden + j];
      act[i * s.hidden + j] = g.value;
      grad_h[i * s.hidden + j] = grad_a * g.slope;
    }
  }
  c10::SmallVector<double, 64> scratch(static_cast<size_t>(std::max(s.in, s.hidden)));
  for (int64_t o = 0; o < s.out; ++o) {
    double bias = 0.0;
    for (int64_t i = 0; i < s.rows; ++i) bias += gy[i * s.out + o];
    gb2[o] = static_cast<T>(bias);
    // gw2[o, :] = Σ_i gy[i, o] · act[i, :]
    combine_rows(s.rows, gy + o, s.out, act, s.hidden, s.hidden, scratch.data(), gw2 + o * s.hidden);
  }
  for (int64_t j = 0; j < s.hidden; ++j) {
    double bias = 0.0;
    for (int64_t i = 0; i < s.rows; ++i) bias += grad_h[i * s.hidden + j];
    gb1[j] = static_cast<T>(bias);
    // gw1[j, :] = Σ_i grad_h[i, j] · x[i, :]
    combine_rows(s.rows, grad_h + j, s.hidden, x, s.in, s.in, scratch.data(), gw1 + j * s.in);
  }
  if (gx == nullptr) return;
  for (int64_t i = 0; i < s.rows; ++i) {
    // gx[i, :] = Σ_j grad_h[i, j] · W1[j, :]
    combine_rows(s.hidden, grad_h + i * s.hidden, 1, w1, s.in, s.in, scratch.data(), gx + i * s.in);
  }
}

// The whole network as one autograd node. Saves x, the weights and the
// pre-activation; the activation and its slope are recomputed in backward.
class FusedGeluMlp : public torch::autograd::Function<FusedGeluMlp> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w1,
                               const torch::Tensor& b1, const torch::Tensor& w2, const torch::Tensor& b2) {
    // Named in profiler traces: a custom Function's forward is not an operator.
    RECORD_FUNCTION("gradaccum::gelu_mlp", std::vector<c10::IValue>());
    const auto rows = x.size(0);
    // at:: factories: outputs of an autograd::Function need no variable wrapping.
    auto h = at::empty({rows, w1.size(0)}, x.options());
    auto y = at::empty({rows, w2.size(0)}, x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "fused_gelu_mlp_forward", [&] {
      const Shapes s{rows, w1.size(1), w1.size(0), w2.size(0)};
      forward_loops(x.data_ptr<scalar_t>(), w1.data_ptr<scalar_t>(), b1.data_ptr<scalar_t>(), w2.data_ptr<scalar_t>(),
                    b2.data_ptr<scalar_t>(), h.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), s);
    });
    ctx->save_for_backward({x, w1, w2, h});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // The loops build no graph: a second derivative would silently be zero.
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "GeluMlp's fused CPU path is not twice differentiable (backward with create_graph)");
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& w1 = saved[1];
    const auto& w2 = saved[2];
    const auto& h = saved[3];
    const auto gy = grad_outputs[0].contiguous();
    const bool want_x = ctx->needs_input_grad(0);
    const auto options = w1.options();
    auto gx = want_x ? at::empty(x.sizes(), options) : torch::Tensor();
    auto gw1 = at::empty(w1.sizes(), options);
    auto gb1 = at::empty({w1.size(0)}, options);
    auto gw2 = at::empty(w2.sizes(), options);
    auto gb2 = at::empty({w2.size(0)}, options);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "fused_gelu_mlp_backward", [&] {
      const Shapes s{x.size(0), w1.size(1), w1.size(0), w2.size(0)};
      backward_loops(x.data_ptr<scalar_t>(), w1.data_ptr<scalar_t>(), w2.data_ptr<scalar_t>(), h.data_ptr<scalar_t>(),
                     gy.data_ptr<scalar_t>(), want_x ? gx.data_ptr<scalar_t>() : nullptr, gw1.data_ptr<scalar_t>(),
                     gb1.data_ptr<scalar_t>(), gw2.data_ptr<scalar_t>(), gb2.data_ptr<scalar_t>(), s);
    });
    return {gx, gw1, gb1, gw2, gb2};
  }
};

bool contiguous_cpu(const torch::Tensor& t, torch::ScalarType dtype) {
  return t.device().is_cpu() && t.layout() == torch::kStrided && t.scalar_type() == dtype && t.is_contiguous();
}

}  // namespace

bool gelu_mlp_fuses(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1, const torch::Tensor& w2,
                    const torch::Tensor& b2) {
  if (!custom_kernel_enabled(CustomKernel::gelu_mlp)) return false;
  const auto dtype = x.scalar_type();
  if (dtype != torch::kFloat && dtype != torch::kDouble) return false;
  if (at::autocast::is_autocast_enabled(at::kCPU)) return false;  // autocast runs the Linear layers in bf16
  if (x.dim() != 2 || x.size(1) != w1.size(1)) return false;
  for (const auto* t : {&x, &w1, &b1, &w2, &b2}) {
    if (!contiguous_cpu(*t, dtype)) return false;
  }
  const int64_t per_row = w1.size(0) * w1.size(1) + w2.size(0) * w2.size(1);
  return x.size(0) * per_row <= kGeluMlpMaxFusedMultiplyAdds;
}

torch::Tensor gelu_mlp(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                       const torch::Tensor& w2, const torch::Tensor& b2) {
  if (gelu_mlp_fuses(x, w1, b1, w2, b2)) return FusedGeluMlp::apply(x, w1, b1, w2, b2);
  return torch::linear(torch::gelu(torch::linear(x, w1, b1)), w2, b2);
}

}  // namespace gradaccum::kernels
