#include "gradaccum/kernels/qkv_attention.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "gradaccum/base/check.h"
#include "gradaccum/kernels/blas_gemm.h"
#include "gradaccum/kernels/custom_kernels.h"
#include "gradaccum/kernels/flush_denormals.h"
#include "gradaccum/kernels/masked_softmax.h"
#include "gradaccum/kernels/vector_exp.h"

namespace gradaccum::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

inline __attribute__((always_inline)) float exp_of(float x) { return exp_nonpositive(x); }
inline __attribute__((always_inline)) double exp_of(double x) { return std::exp(x); }

// One row of scores in place → probabilities: p = softmax(score · scale + bias) over
// the allowed keys, 0 elsewhere; uniform 1/T when no key is allowed (what softmax
// gives when every score holds the dtype's lowest value). scale = 1/√D, exact for
// the usual head sizes (64 = 8²), where it equals the reference's division by √D.
// Without a key bias `bias` holds zeros, which leave every score as it was.
template <typename T>
inline __attribute__((always_inline)) void softmax_row(T* row, const T* allowed, const T* bias, int64_t keys, T scale) {
  T lane_max[kVectorLanes];
  for (int l = 0; l < kVectorLanes; ++l) lane_max[l] = -std::numeric_limits<T>::infinity();
  int64_t s = 0;
  // Every load and every operation happens for every key, and the mask (1 or 0 in
  // T) only selects or multiplies: a branch on a bool keeps the compiler from vectorizing.
  for (; s + kVectorLanes <= keys; s += kVectorLanes) {
    for (int l = 0; l < kVectorLanes; ++l) {
      const T x = row[s + l] * scale + bias[s + l];
      const T v = allowed[s + l] > T(0) ? x : -std::numeric_limits<T>::infinity();
      lane_max[l] = v > lane_max[l] ? v : lane_max[l];
    }
  }
  T max = -std::numeric_limits<T>::infinity();
  for (int l = 0; l < kVectorLanes; ++l) max = lane_max[l] > max ? lane_max[l] : max;
  for (; s < keys; ++s) {
    const T v = allowed[s] > T(0) ? row[s] * scale + bias[s] : -std::numeric_limits<T>::infinity();
    max = v > max ? v : max;
  }
  if (max == -std::numeric_limits<T>::infinity()) {
    for (s = 0; s < keys; ++s) row[s] = T(1) / static_cast<T>(keys);
    return;
  }
  T lane_sum[kVectorLanes] = {};
  s = 0;
  for (; s + kVectorLanes <= keys; s += kVectorLanes) {
    for (int l = 0; l < kVectorLanes; ++l) {
      const T shifted = row[s + l] * scale + bias[s + l] - max;  // > 0 only for a masked key
      const T e = exp_of(shifted > T(0) ? T(0) : shifted) * allowed[s + l];
      row[s + l] = e;
      lane_sum[l] += e;
    }
  }
  T sum = 0;
  for (int l = 0; l < kVectorLanes; ++l) sum += lane_sum[l];
  for (; s < keys; ++s) {
    row[s] = allowed[s] > T(0) ? exp_of(row[s] * scale + bias[s] - max) : T(0);
    sum += row[s];
  }
  const T inverse = T(1) / sum;
  for (s = 0; s < keys; ++s) row[s] *= inverse;
}

// One row of d/d probabilities in place → d/d scores (before the scaling):
// p ⊙ (dp − Σ dp ⊙ p) · scale where allowed, 0 elsewhere (masked_fill's gradient).
template <typename T>
inline __attribute__((always_inline)) void softmax_grad_row(T* grad, const T* probs, const T* allowed, int64_t keys,
                                                            T scale) {
  T lane_dot[kVectorLanes] = {};
  int64_t s = 0;
  for (; s + kVectorLanes <= keys; s += kVectorLanes) {
    for (int l = 0; l < kVectorLanes; ++l) lane_dot[l] += grad[s + l] * probs[s + l];
  }
  T dot = 0;
  for (int l = 0; l < kVectorLanes; ++l) dot += lane_dot[l];
  for (; s < keys; ++s) dot += grad[s] * probs[s];
  for (s = 0; s < keys; ++s) {
    grad[s] = allowed[s] > T(0) ? probs[s] * (grad[s] - dot) * scale : T(0);
  }
}

// `count` rows of `keys` entries, `stride` apart (the first `keys` of each T-wide row),
// all with the same key bias.
GRADACCUM_VECTOR_CLONES void softmax_rows(float* rows, const float* allowed, const float* bias, int64_t count,
                                          int64_t keys, int64_t stride, float scale) {
  for (int64_t t = 0; t < count; ++t) {
    softmax_row(rows + t * stride, allowed + t * stride, bias, keys, scale);
  }
}

void softmax_rows(double* rows, const double* allowed, const double* bias, int64_t count, int64_t keys, int64_t stride,
                  double scale) {
  for (int64_t t = 0; t < count; ++t) {
    softmax_row(rows + t * stride, allowed + t * stride, bias, keys, scale);
  }
}

GRADACCUM_VECTOR_CLONES void softmax_grad_rows(float* grad, const float* probs, const float* allowed, int64_t count,
                                               int64_t keys, int64_t stride, float scale) {
  for (int64_t t = 0; t < count; ++t) {
    softmax_grad_row(grad + t * stride, probs + t * stride, allowed + t * stride, keys, scale);
  }
}

void softmax_grad_rows(double* grad, const double* probs, const double* allowed, int64_t count, int64_t keys,
                       int64_t stride, double scale) {
  for (int64_t t = 0; t < count; ++t) {
    softmax_grad_row(grad + t * stride, probs + t * stride, allowed + t * stride, keys, scale);
  }
}

// Queries are taken in blocks of rows, and a block's products stop at the last
// key any of its rows may see: under a causal mask the keys past every row's last
// allowed one (whose probabilities would be exactly 0) are skipped. Smaller blocks
// skip more of the upper triangle but make smaller products, which BLAS runs
// slower, the more so the more keys they span. The sizes are the fastest measured
// by bench/attention_ab (forward + backward) on the 2-core AVX-512 EPYC: at
// T = 64, 32 rows (0.90× the time of 16); at T = 96 and 128 (the GPT benchmarks),
// 16 rows (0.89–0.94× the time of 32); from T = 256 (BLOOM's 512 included), 64 rows
// (0.62× the time of 32 at T = 512); at T = 192 the three sizes tie.
int64_t query_block_rows(int64_t time) {
  if (time <= 64) return 32;
  return time <= 128 ? 16 : 64;
}

int64_t query_blocks(int64_t time) {
  const int64_t rows = query_block_rows(time);
  return (time + rows - 1) / rows;
}

// For every query block of every mask row set: how many leading keys its rows
// need — one past the last allowed key of any of its rows, or all T when one of
// its rows has none (that row attends uniformly to all T keys).
template <typename T>
std::vector<int64_t> block_key_counts(const T* allowed, int64_t mask_batch, int64_t time) {
  const int64_t blocks = query_blocks(time);
  const int64_t block_rows = query_block_rows(time);
  std::vector<int64_t> keys(static_cast<size_t>(mask_batch * blocks), 0);
  for (int64_t m = 0; m < mask_batch; ++m) {
    for (int64_t t = 0; t < time; ++t) {
      const T* row = allowed + (m * time + t) * time;
      int64_t end = time;
      while (end > 0 && !(row[end - 1] > T(0))) --end;
      int64_t& block = keys[static_cast<size_t>(m * blocks + t / block_rows)];
      block = std::max(block, end == 0 ? time : end);
    }
  }
  return keys;
}

// The shapes of one call.
struct Layout {
  int64_t batch, time, channels, heads, head_dim, mask_batch;
  int64_t bias_batch;  // key_bias's batch (1 or B)
  QkvPacking packing;
  int64_t row() const { return 3 * channels; }  // qkv's row stride
  // Head h's queries start at h · head_stride() in a row, its keys part_stride() after them
  // and its values part_stride() after the keys.
  int64_t head_stride() const { return packing == QkvPacking::by_head ? 3 * head_dim : head_dim; }
  int64_t part_stride() const { return packing == QkvPacking::by_head ? head_dim : channels; }
};

Layout layout_of(const torch::Tensor& qkv, int64_t n_head, const torch::Tensor& allowed, int64_t bias_batch,
                 QkvPacking packing) {
  const int64_t channels = qkv.size(2) / 3;
  return {qkv.size(0), qkv.size(1), channels, n_head, channels / n_head, allowed.size(0), bias_batch, packing};
}

// key_bias: [bias_batch, H, 1, T].
template <typename T>
void attention_forward(const Layout& s, const T* qkv, const T* allowed, const T* key_bias, T* probs, T* y) {
  const T scale = T(1) / std::sqrt(static_cast<T>(s.head_dim));
  const int64_t tt = s.time * s.time;
  const int64_t blocks = query_blocks(s.time), block_rows = query_block_rows(s.time);
  const auto block_keys = block_key_counts(allowed, s.mask_batch, s.time);
  at::parallel_for(0, s.batch * s.heads, 1, [&](int64_t begin, int64_t end) {
    const FlushDenormalsScope flush;  // its header says why
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / s.heads, h = item % s.heads;
      const int64_t m = s.mask_batch == 1 ? 0 : b;
      const T* bias = key_bias + ((s.bias_batch == 1 ? 0 : b) * s.heads + h) * s.time;
      const T* q = qkv + b * s.time * s.row() + h * s.head_stride();
      const T* k = q + s.part_stride();
      const T* v = k + s.part_stride();
      T* out = y + b * s.time * s.channels + h * s.head_dim;
      // Entries of p past a block's key count are never written nor read.
      T* p = probs + item * tt;
      const T* mask = allowed + m * tt;
      for (int64_t block = 0; block < blocks; ++block) {
        const int64_t r0 = block * block_rows, rows = std::min(block_rows, s.time - r0);
        const int64_t keys = block_keys[static_cast<size_t>(m * blocks + block)];
        blas_gemm(false, true, rows, keys, s.head_dim, T(1), q + r0 * s.row(), s.row(), k, s.row(), T(0),
                  p + r0 * s.time, s.time);  // scores = q kᵀ
        softmax_rows(p + r0 * s.time, mask + r0 * s.time, bias, rows, keys, s.time, scale);
        blas_gemm(false, false, rows, s.head_dim, keys, T(1), p + r0 * s.time, s.time, v, s.row(), T(0),
                  out + r0 * s.channels, s.channels);  // y = p v
      }
    }
  });
}

// grad_qkv must hold zeros: d k and d v are summed over the query blocks.
template <typename T>
void attention_backward(const Layout& s, const T* qkv, const T* allowed, const T* probs, const T* grad_y, T* grad_qkv) {
  const T scale = T(1) / std::sqrt(static_cast<T>(s.head_dim));
  const int64_t tt = s.time * s.time;
  const int64_t blocks = query_blocks(s.time), block_rows = query_block_rows(s.time);
  const auto block_keys = block_key_counts(allowed, s.mask_batch, s.time);
  at::parallel_for(0, s.batch * s.heads, 1, [&](int64_t begin, int64_t end) {
    const FlushDenormalsScope flush;
    std::vector<T> grad_scores(static_cast<size_t>(tt));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / s.heads, h = item % s.heads;
      const int64_t m = s.mask_batch == 1 ? 0 : b;
      const int64_t offset = b * s.time * s.row() + h * s.head_stride();
      const T* q = qkv + offset;
      const T* k = q + s.part_stride();
      const T* v = k + s.part_stride();
      T* dq = grad_qkv + offset;
      T* dk = dq + s.part_stride();
      T* dv = dk + s.part_stride();
      const T* dy = grad_y + b * s.time * s.channels + h * s.head_dim;
      for (int64_t block = 0; block < blocks; ++block) {
        const int64_t r0 = block * block_rows, rows = std::min(block_rows, s.time - r0);
        const int64_t keys = block_keys[static_cast<size_t>(m * blocks + block)];
        const T* p = probs + item * tt + r0 * s.time;
        const T* mask = allowed + m * tt + r0 * s.time;
        T* ds = grad_scores.data() + r0 * s.time;
        const T* dy_rows = dy + r0 * s.channels;
        blas_gemm(false, true, rows, keys, s.head_dim, T(1), dy_rows, s.channels, v, s.row(), T(0), ds,
                  s.time);  // d p = d y vᵀ
        blas_gemm(true, false, keys, s.head_dim, rows, T(1), p, s.time, dy_rows, s.channels, T(1), dv,
                  s.row());  // d v += pᵀ d y
        softmax_grad_rows(ds, p, mask, rows, keys, s.time, scale);
        blas_gemm(false, false, rows, s.head_dim, keys, T(1), ds, s.time, k, s.row(), T(0), dq + r0 * s.row(),
                  s.row());  // d q = d scores k
        blas_gemm(true, false, keys, s.head_dim, rows, T(1), ds, s.time, q + r0 * s.row(), s.row(), T(1), dk,
                  s.row());  // d k += d scoresᵀ q
      }
    }
  });
}

class FusedQkvAttention : public torch::autograd::Function<FusedQkvAttention> {
 public:
  // key_bias: [1 or B, H, 1, T], contiguous in qkv's dtype (zeros for none: adding 0 leaves
  // every score as it is). packing: a QkvPacking.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& qkv, const torch::Tensor& allowed,
                               const torch::Tensor& key_bias, int64_t n_head, int64_t packing) {
    // Named in profiler traces: a custom Function's forward is not an operator.
    RECORD_FUNCTION("gradaccum::qkv_attention", std::vector<c10::IValue>());
    const Layout s = layout_of(qkv, n_head, allowed, key_bias.size(0), static_cast<QkvPacking>(packing));
    auto y = torch::empty({s.batch, s.time, s.channels}, qkv.options());
    auto probs = torch::empty({s.batch, s.heads, s.time, s.time}, qkv.options());
    // The mask as 1/0 in qkv's dtype, which the row loops multiply and compare with.
    const auto mask = allowed.to(qkv.scalar_type());
    AT_DISPATCH_FLOATING_TYPES(qkv.scalar_type(), "qkv_attention", [&] {
      attention_forward<scalar_t>(s, qkv.data_ptr<scalar_t>(), mask.data_ptr<scalar_t>(), key_bias.data_ptr<scalar_t>(),
                                  probs.data_ptr<scalar_t>(), y.data_ptr<scalar_t>());
    });
    // The backward needs only the probabilities: the bias is inside them.
    ctx->save_for_backward({qkv, mask, probs});
    ctx->saved_data["n_head"] = n_head;
    ctx->saved_data["packing"] = packing;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    GA_CHECK(!torch::GradMode::is_enabled(),
             "qkv_attention: the fused CPU path is not twice differentiable (backward with "
             "create_graph)");
    const auto saved = ctx->get_saved_variables();
    const auto& qkv = saved[0];
    const auto& mask = saved[1];
    const auto& probs = saved[2];
    const int64_t n_head = ctx->saved_data["n_head"].toInt();
    // The backward reads no bias: its batch is irrelevant here.
    const Layout s =
        layout_of(qkv, n_head, mask, /*bias_batch=*/1, static_cast<QkvPacking>(ctx->saved_data["packing"].toInt()));
    const auto grad_y = grad_outputs[0].to(qkv.scalar_type()).contiguous();
    auto grad_qkv = torch::zeros_like(qkv);
    AT_DISPATCH_FLOATING_TYPES(qkv.scalar_type(), "qkv_attention_backward", [&] {
      attention_backward<scalar_t>(s, qkv.data_ptr<scalar_t>(), mask.data_ptr<scalar_t>(), probs.data_ptr<scalar_t>(),
                                   grad_y.data_ptr<scalar_t>(), grad_qkv.data_ptr<scalar_t>());
    });
    return {grad_qkv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

void check_shapes(const torch::Tensor& qkv, int64_t n_head, const torch::Tensor& allowed,
                  const QkvAttentionOptions& options) {
  GA_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0,
           "qkv_attention: qkv must be [B, T, 3C], got {} dimension(s) with last size {}", qkv.dim(),
           qkv.dim() > 0 ? qkv.size(-1) : 0);
  const int64_t channels = qkv.size(2) / 3;
  GA_CHECK(n_head > 0 && channels % n_head == 0, "qkv_attention: {} channels are not divisible into {} heads", channels,
           n_head);
  GA_CHECK(allowed.dim() == 4 && allowed.scalar_type() == torch::kBool &&
               (allowed.size(0) == 1 || allowed.size(0) == qkv.size(0)) && allowed.size(1) == 1 &&
               allowed.size(2) == qkv.size(1) && allowed.size(3) == qkv.size(1),
           "qkv_attention: allowed must be a bool [B or 1, 1, T, T] mask for B = {}, T = {}", qkv.size(0), qkv.size(1));
  const auto& bias = options.key_bias;
  GA_CHECK(!bias.defined() ||
               (bias.dim() == 4 && bias.is_floating_point() && (bias.size(0) == 1 || bias.size(0) == qkv.size(0)) &&
                bias.size(1) == n_head && bias.size(2) == 1 && bias.size(3) == qkv.size(1)),
           "qkv_attention: key_bias must be a floating-point [B or 1, H, 1, T] tensor for B = {}, H = {}, T = {}",
           qkv.size(0), n_head, qkv.size(1));
}

}  // namespace

bool qkv_attention_fuses(const torch::Tensor& qkv, int64_t n_head, const torch::Tensor& allowed,
                         const QkvAttentionOptions& options) {
  const auto dtype = qkv.scalar_type();
  const bool autocast = at::autocast::is_autocast_enabled(at::kCPU);
  const bool dtype_fuses = autocast ? (dtype == torch::kBFloat16 || dtype == torch::kHalf) &&
                                          at::autocast::get_autocast_dtype(at::kCPU) == dtype
                                    : dtype == torch::kFloat || dtype == torch::kDouble;
  return custom_kernel_enabled(CustomKernel::qkv_attention) && qkv.is_cpu() && allowed.is_cpu() && dtype_fuses &&
         qkv.is_contiguous() && allowed.is_contiguous() &&
         (!options.key_bias.defined() ||
          (options.key_bias.is_cpu() && options.key_bias.is_contiguous() && !options.key_bias.requires_grad())) &&
         blas_gemm_available();
}

namespace {

// qkv [B, T, 3C] → q, k, v as [B, H, T, D] views.
std::array<torch::Tensor, 3> split_heads(const torch::Tensor& qkv, int64_t n_head, QkvPacking packing) {
  const int64_t batch = qkv.size(0), time = qkv.size(1), channels = qkv.size(2) / 3;
  const int64_t head_dim = channels / n_head;
  if (packing == QkvPacking::by_head) {
    const auto parts = qkv.view({batch, time, n_head, 3, head_dim});
    auto part = [&](int64_t i) { return parts.select(3, i).transpose(1, 2); };
    return {part(0), part(1), part(2)};
  }
  const auto parts = qkv.split(channels, /*dim=*/2);
  auto heads = [&](const torch::Tensor& t) { return t.view({batch, time, n_head, head_dim}).transpose(1, 2); };
  return {heads(parts[0]), heads(parts[1]), heads(parts[2])};
}

// q·kᵀ / √D + key_bias [B, H, T, T].
torch::Tensor attention_scores(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& key_bias) {
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  return key_bias.defined() ? scores + key_bias : scores;
}

// y [B, H, T, D] → [B, T, C], heads concatenated.
torch::Tensor merge_heads(const torch::Tensor& y) {
  return y.transpose(1, 2).contiguous().view({y.size(0), y.size(2), y.size(1) * y.size(3)});
}

}  // namespace

torch::Tensor qkv_attention_sdpa(const torch::Tensor& qkv, int64_t n_head, const torch::Tensor& allowed,
                                 const QkvAttentionOptions& options) {
  check_shapes(qkv, n_head, allowed, options);
  const auto [q, k, v] = split_heads(qkv, n_head, options.packing);
  // An additive mask holding the dtype's lowest value where a key is not allowed, not a
  // boolean one: a row without any allowed key then attends uniformly (the convention
  // above), where a boolean mask would make it NaN or zero depending on the backend. In
  // qkv's dtype, which is the scores' (under 16-bit autocast, float32's lowest would round
  // to -inf and a fully masked row would be NaN).
  const auto lowest = torch::scalar_tensor(lowest_finite(qkv.scalar_type()), qkv.options());
  const auto bias = options.key_bias.defined()
                        ? torch::where(allowed, options.key_bias.to(qkv.scalar_type()), lowest)
                        : torch::zeros(allowed.sizes(), qkv.options()).masked_fill_(allowed.logical_not(), lowest);
  return merge_heads(at::scaled_dot_product_attention(q, k, v, bias));
}

torch::Tensor qkv_attention_reference(const torch::Tensor& qkv, int64_t n_head, const torch::Tensor& allowed,
                                      const QkvAttentionOptions& options) {
  return qkv_attention_transformed(
      qkv, n_head, allowed, [](const torch::Tensor& p) { return p; }, options);
}

torch::Tensor qkv_attention_transformed(const torch::Tensor& qkv, int64_t n_head, const torch::Tensor& allowed,
                                        const std::function<torch::Tensor(const torch::Tensor&)>& on_probabilities,
                                        const QkvAttentionOptions& options) {
  check_shapes(qkv, n_head, allowed, options);
  const auto [q, k, v] = split_heads(qkv, n_head, options.packing);
  const auto scores = attention_scores(q, k, options.key_bias);
  return merge_heads(torch::matmul(on_probabilities(masked_softmax(scores, allowed)), v));
}

torch::Tensor qkv_attention(const torch::Tensor& qkv, int64_t n_head, const torch::Tensor& allowed,
                            const QkvAttentionOptions& options) {
  check_shapes(qkv, n_head, allowed, options);
  if (!qkv_attention_fuses(qkv, n_head, allowed, options)) return qkv_attention_sdpa(qkv, n_head, allowed, options);
  const auto packing = static_cast<int64_t>(options.packing);
  // Under 16-bit autocast: float32 arithmetic on the 16-bit inputs, the result rounded
  // back (autocast's matmuls would return 16 bits too); the softmax is float32 either way.
  const bool half = qkv.scalar_type() == torch::kBFloat16 || qkv.scalar_type() == torch::kHalf;
  const auto dtype = half ? torch::kFloat : qkv.scalar_type();
  const auto key_bias = options.key_bias.defined()
                            ? options.key_bias.to(dtype)
                            : torch::zeros({1, n_head, 1, qkv.size(1)}, qkv.options().dtype(dtype));
  const auto y = FusedQkvAttention::apply(qkv.to(dtype), allowed, key_bias, n_head, packing);
  return half ? y.to(qkv.scalar_type()) : y;
}

}  // namespace gradaccum::kernels
