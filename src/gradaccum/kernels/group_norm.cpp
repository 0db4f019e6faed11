#include "gradaccum/kernels/group_norm.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "gradaccum/base/check.h"
#include "gradaccum/kernels/custom_kernels.h"
#include "gradaccum/kernels/vector_exp.h"

namespace gradaccum::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A channels-last sample is `pixels` rows of `channels` values. Every loop below
// runs over one row's channels, so it vectorizes whatever the group size. Sums run
// in the element type over blocks of kBlockRows rows and are added to float64
// totals per block: float32 accuracy for 64 terms, float64 across the image.
constexpr int64_t kBlockRows = 64;

template <typename T>
inline __attribute__((always_inline)) void sum_rows(const T* __restrict x, int64_t rows, int64_t channels,
                                                    T* __restrict sum) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * channels;
    for (int64_t c = 0; c < channels; ++c) sum[c] += row[c];
  }
}

template <typename T>
inline __attribute__((always_inline)) void sum_square_deviations(const T* __restrict x, int64_t rows, int64_t channels,
                                                                 const T* __restrict mean, T* __restrict sum) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * channels;
    for (int64_t c = 0; c < channels; ++c) {
      const T d = row[c] - mean[c];
      sum[c] += d * d;
    }
  }
}

template <typename T>
inline __attribute__((always_inline)) void affine_rows(const T* __restrict x, int64_t rows, int64_t channels,
                                                       const T* __restrict scale, const T* __restrict shift,
                                                       T* __restrict y) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * channels;
    T* out = y + r * channels;
    for (int64_t c = 0; c < channels; ++c) out[c] = row[c] * scale[c] + shift[c];
  }
}

template <typename T>
inline __attribute__((always_inline)) void sum_grad_rows(const T* __restrict grad_y, const T* __restrict x,
                                                         int64_t rows, int64_t channels, T* __restrict sum_grad,
                                                         T* __restrict sum_grad_x) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = grad_y + r * channels;
    const T* row = x + r * channels;
    for (int64_t c = 0; c < channels; ++c) {
      sum_grad[c] += g[c];
      sum_grad_x[c] += g[c] * row[c];
    }
  }
}

// grad_x = alpha·grad_y + beta·(x − mean) + delta, per channel.
template <typename T>
inline __attribute__((always_inline)) void input_grad_rows(const T* __restrict grad_y, const T* __restrict x,
                                                           int64_t rows, int64_t channels, const T* __restrict alpha,
                                                           const T* __restrict beta, const T* __restrict mean,
                                                           const T* __restrict delta, T* __restrict grad_x) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = grad_y + r * channels;
    const T* row = x + r * channels;
    T* out = grad_x + r * channels;
    for (int64_t c = 0; c < channels; ++c) out[c] = alpha[c] * g[c] + beta[c] * (row[c] - mean[c]) + delta[c];
  }
}

// float32: compiled for AVX-512, AVX2 and the baseline (kernels/vector_exp.h). float64
// is the tests' dtype and stays on the baseline.
GRADACCUM_VECTOR_CLONES void sum_rows_f(const float* __restrict x, int64_t rows, int64_t channels,
                                        float* __restrict sum) {
  sum_rows(x, rows, channels, sum);
}
GRADACCUM_VECTOR_CLONES void sum_square_deviations_f(const float* __restrict x, int64_t rows, int64_t channels,
                                                     const float* __restrict mean, float* __restrict sum) {
  sum_square_deviations(x, rows, channels, mean, sum);
}
GRADACCUM_VECTOR_CLONES void affine_rows_f(const float* __restrict x, int64_t rows, int64_t channels,
                                           const float* __restrict scale, const float* __restrict shift,
                                           float* __restrict y) {
  affine_rows(x, rows, channels, scale, shift, y);
}
GRADACCUM_VECTOR_CLONES void sum_grad_rows_f(const float* __restrict grad_y, const float* __restrict x, int64_t rows,
                                             int64_t channels, float* __restrict sum_grad,
                                             float* __restrict sum_grad_x) {
  sum_grad_rows(grad_y, x, rows, channels, sum_grad, sum_grad_x);
}
GRADACCUM_VECTOR_CLONES void input_grad_rows_f(const float* __restrict grad_y, const float* __restrict x, int64_t rows,
                                               int64_t channels, const float* __restrict alpha,
                                               const float* __restrict beta, const float* __restrict mean,
                                               const float* __restrict delta, float* __restrict grad_x) {
  input_grad_rows(grad_y, x, rows, channels, alpha, beta, mean, delta, grad_x);
}

// The row loops by element type: float32 through the per-ISA clones above, float64 through the
// templates (the float64 path is the exactness reference, not a hot one).
struct Rows {
  template <typename T>
  static void sum(const T* x, int64_t rows, int64_t channels, T* s) {
    if constexpr (std::is_same_v<T, float>) {
      sum_rows_f(x, rows, channels, s);
    } else {
      sum_rows(x, rows, channels, s);
    }
  }
  template <typename T>
  static void square_deviations(const T* x, int64_t rows, int64_t channels, const T* mean, T* s) {
    if constexpr (std::is_same_v<T, float>) {
      sum_square_deviations_f(x, rows, channels, mean, s);
    } else {
      sum_square_deviations(x, rows, channels, mean, s);
    }
  }
  template <typename T>
  static void affine(const T* x, int64_t rows, int64_t channels, const T* scale, const T* shift, T* y) {
    if constexpr (std::is_same_v<T, float>) {
      affine_rows_f(x, rows, channels, scale, shift, y);
    } else {
      affine_rows(x, rows, channels, scale, shift, y);
    }
  }
  template <typename T>
  static void grad_sums(const T* grad_y, const T* x, int64_t rows, int64_t channels, T* sum_grad, T* sum_grad_x) {
    if constexpr (std::is_same_v<T, float>) {
      sum_grad_rows_f(grad_y, x, rows, channels, sum_grad, sum_grad_x);
    } else {
      sum_grad_rows(grad_y, x, rows, channels, sum_grad, sum_grad_x);
    }
  }
  template <typename T>
  static void input_grad(const T* grad_y, const T* x, int64_t rows, int64_t channels, const T* alpha, const T* beta,
                         const T* mean, const T* delta, T* grad_x) {
    if constexpr (std::is_same_v<T, float>) {
      input_grad_rows_f(grad_y, x, rows, channels, alpha, beta, mean, delta, grad_x);
    } else {
      input_grad_rows(grad_y, x, rows, channels, alpha, beta, mean, delta, grad_x);
    }
  }
};

// Per-channel totals over a sample's pixels, in float64: `step(first_row, rows, block)`
// adds a block's sums into `block` (kept in T, zeroed before each block).
template <typename T, typename Step>
void blocked_totals(int64_t pixels, int64_t width, std::vector<T>& block, std::vector<double>& totals,
                    const Step& step) {
  std::fill(totals.begin(), totals.end(), 0.0);
  for (int64_t first = 0; first < pixels; first += kBlockRows) {
    std::fill(block.begin(), block.end(), T(0));
    step(first, std::min(kBlockRows, pixels - first), block.data());
    for (int64_t c = 0; c < width; ++c) totals[c] += static_cast<double>(block[c]);
  }
}

struct Shape {
  int64_t samples, channels, pixels, groups;
  int64_t group_size() const { return channels / groups; }
};

Shape shape_of(const torch::Tensor& x, int64_t groups) { return {x.size(0), x.size(1), x.size(2) * x.size(3), groups}; }

// Writes y and each (sample, group)'s mean and 1/sqrt(var + eps) (float64, [N, G]).
template <typename T>
void forward_kernel(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, Shape s, double eps,
                    torch::Tensor& y, torch::Tensor& mean, torch::Tensor& rstd) {
  const T* in = x.data_ptr<T>();
  T* out = y.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  const T* b = bias.data_ptr<T>();
  double* mean_out = mean.data_ptr<double>();
  double* rstd_out = rstd.data_ptr<double>();
  const int64_t C = s.channels, D = s.group_size(), count = s.pixels * D;
  at::parallel_for(0, s.samples, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> block(C), channel_mean(C), scale(C), shift(C);
    std::vector<double> totals(C), group_mean(s.groups);
    for (int64_t n = begin; n < end; ++n) {
      const T* xn = in + n * s.pixels * C;
      blocked_totals<T>(s.pixels, C, block, totals,
                        [&](int64_t first, int64_t rows, T* sum) { Rows::sum(xn + first * C, rows, C, sum); });
      for (int64_t g = 0; g < s.groups; ++g) {
        double sum = 0;
        for (int64_t c = g * D; c < (g + 1) * D; ++c) sum += totals[c];
        group_mean[g] = sum / static_cast<double>(count);
        for (int64_t c = g * D; c < (g + 1) * D; ++c) channel_mean[c] = static_cast<T>(group_mean[g]);
      }
      // Two passes (mean, then squared deviations): no cancellation of E[x²] − E[x]².
      blocked_totals<T>(s.pixels, C, block, totals, [&](int64_t first, int64_t rows, T* sum) {
        Rows::square_deviations(xn + first * C, rows, C, channel_mean.data(), sum);
      });
      for (int64_t g = 0; g < s.groups; ++g) {
        double sum = 0;
        for (int64_t c = g * D; c < (g + 1) * D; ++c) sum += totals[c];
        const double r = 1.0 / std::sqrt(sum / static_cast<double>(count) + eps);
        mean_out[n * s.groups + g] = group_mean[g];
        rstd_out[n * s.groups + g] = r;
        for (int64_t c = g * D; c < (g + 1) * D; ++c) {
          const double a = r * static_cast<double>(w[c]);
          scale[c] = static_cast<T>(a);
          shift[c] = static_cast<T>(static_cast<double>(b[c]) - group_mean[g] * a);
        }
      }
      Rows::affine(xn, s.pixels, C, scale.data(), shift.data(), out + n * s.pixels * C);
    }
  });
}

// With x̂ = (x − μ)·r and K = pixels × group size, the gradient of a group's input is
//   dx = r·w·dy − r·mean_K(w·dy) − r·x̂·mean_K(w·dy·x̂),
// and both means come from each channel's Σ dy and Σ dy·x. The weight's gradient is
// Σ_n r·(Σ dy·x − μ·Σ dy), the bias's Σ_n Σ dy.
template <typename T>
void backward_kernel(const torch::Tensor& grad_y, const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& mean, const torch::Tensor& rstd, Shape s, torch::Tensor& grad_x,
                     torch::Tensor& grad_weight, torch::Tensor& grad_bias) {
  const T* gy = grad_y.data_ptr<T>();
  const T* in = x.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  const double* mu = mean.data_ptr<double>();
  const double* rs = rstd.data_ptr<double>();
  T* gx = grad_x.data_ptr<T>();
  const int64_t C = s.channels, D = s.group_size(), count = s.pixels * D;
  // Each sample's per-channel Σ dy and Σ dy·x, for the parameters' gradients.
  std::vector<double> sums_grad(s.samples * C), sums_grad_x(s.samples * C);
  at::parallel_for(0, s.samples, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> block(2 * C), alpha(C), beta(C), channel_mean(C), delta(C);
    std::vector<double> totals(2 * C);
    for (int64_t n = begin; n < end; ++n) {
      const int64_t offset = n * s.pixels * C;
      blocked_totals<T>(s.pixels, 2 * C, block, totals, [&](int64_t first, int64_t rows, T* sum) {
        Rows::grad_sums(gy + offset + first * C, in + offset + first * C, rows, C, sum, sum + C);
      });
      std::copy(totals.begin(), totals.begin() + C, sums_grad.begin() + n * C);
      std::copy(totals.begin() + C, totals.end(), sums_grad_x.begin() + n * C);
      for (int64_t g = 0; g < s.groups; ++g) {
        const double m = mu[n * s.groups + g], r = rs[n * s.groups + g];
        double w_grad = 0, w_grad_x = 0;
        for (int64_t c = g * D; c < (g + 1) * D; ++c) {
          w_grad += static_cast<double>(w[c]) * totals[c];
          w_grad_x += static_cast<double>(w[c]) * totals[C + c];
        }
        const double mean_dxhat = w_grad / static_cast<double>(count);
        const double mean_dxhat_xhat = r * (w_grad_x - m * w_grad) / static_cast<double>(count);
        for (int64_t c = g * D; c < (g + 1) * D; ++c) {
          alpha[c] = static_cast<T>(r * static_cast<double>(w[c]));
          beta[c] = static_cast<T>(-r * r * mean_dxhat_xhat);
          channel_mean[c] = static_cast<T>(m);
          delta[c] = static_cast<T>(-r * mean_dxhat);
        }
      }
      Rows::input_grad(gy + offset, in + offset, s.pixels, C, alpha.data(), beta.data(), channel_mean.data(),
                       delta.data(), gx + offset);
    }
  });
  T* gw = grad_weight.data_ptr<T>();
  T* gb = grad_bias.data_ptr<T>();
  for (int64_t c = 0; c < C; ++c) {
    const int64_t g = c / D;
    double dw = 0, db = 0;
    for (int64_t n = 0; n < s.samples; ++n) {
      dw += rs[n * s.groups + g] * (sums_grad_x[n * C + c] - mu[n * s.groups + g] * sums_grad[n * C + c]);
      db += sums_grad[n * C + c];
    }
    gw[c] = static_cast<T>(dw);
    gb[c] = static_cast<T>(db);
  }
}

class ChannelsLastGroupNorm : public torch::autograd::Function<ChannelsLastGroupNorm> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, int64_t groups, double eps) {
    // Named in profiler traces: a custom Function's forward is not an operator.
    RECORD_FUNCTION("gradaccum::group_norm", std::vector<c10::IValue>());
    const Shape s = shape_of(x, groups);
    auto y = torch::empty_like(x, torch::MemoryFormat::ChannelsLast);
    const auto stats = torch::TensorOptions().dtype(torch::kDouble);
    auto mean = torch::empty({s.samples, groups}, stats);
    auto rstd = torch::empty({s.samples, groups}, stats);
    const auto w = weight.contiguous(), b = bias.contiguous();
    if (x.scalar_type() == torch::kFloat) {
      forward_kernel<float>(x, w, b, s, eps, y, mean, rstd);
    } else {
      forward_kernel<double>(x, w, b, s, eps, y, mean, rstd);
    }
    ctx->save_for_backward({x, weight, mean, rstd});
    ctx->saved_data["groups"] = groups;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    GA_CHECK(!torch::GradMode::is_enabled(),
             "group_norm: the fused channels-last CPU path is not twice differentiable (backward with "
             "create_graph)");
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto weight = saved[1].contiguous();
    const Shape s = shape_of(x, ctx->saved_data["groups"].toInt());
    const auto grad_y = grad_outputs[0].to(x.scalar_type()).contiguous(torch::MemoryFormat::ChannelsLast);
    auto grad_x = torch::empty_like(x, torch::MemoryFormat::ChannelsLast);
    auto grad_weight = torch::empty_like(weight);
    auto grad_bias = torch::empty_like(weight);
    if (x.scalar_type() == torch::kFloat) {
      backward_kernel<float>(grad_y, x, weight, saved[2], saved[3], s, grad_x, grad_weight, grad_bias);
    } else {
      backward_kernel<double>(grad_y, x, weight, saved[2], saved[3], s, grad_x, grad_weight, grad_bias);
    }
    return {grad_x, grad_weight, grad_bias, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool group_norm_fuses(const torch::Tensor& x, int64_t groups, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!custom_kernel_enabled(CustomKernel::group_norm)) return false;
  if (!x.defined() || !weight.defined() || !bias.defined()) return false;
  if (!x.is_cpu() || x.dim() != 4 || x.numel() == 0) return false;
  if (x.scalar_type() != torch::kFloat && x.scalar_type() != torch::kDouble) return false;
  if (weight.scalar_type() != x.scalar_type() || bias.scalar_type() != x.scalar_type()) return false;
  if (!weight.is_cpu() || !bias.is_cpu() || weight.numel() != x.size(1) || bias.numel() != x.size(1)) return false;
  if (groups < 1 || x.size(1) % groups != 0) return false;
  return x.is_contiguous(torch::MemoryFormat::ChannelsLast) && !x.is_contiguous();
}

torch::Tensor group_norm(const torch::Tensor& x, int64_t groups, const torch::Tensor& weight, const torch::Tensor& bias,
                         double eps) {
  if (group_norm_fuses(x, groups, weight, bias)) return ChannelsLastGroupNorm::apply(x, weight, bias, groups, eps);
  return torch::group_norm(x, groups, weight, bias, eps);
}

}  // namespace gradaccum::kernels
