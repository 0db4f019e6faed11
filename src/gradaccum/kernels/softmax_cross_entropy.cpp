#include "gradaccum/kernels/softmax_cross_entropy.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gradaccum/base/check.h"
#include "gradaccum/kernels/custom_kernels.h"
#include "gradaccum/kernels/vector_exp.h"

namespace gradaccum::kernels {
namespace {

// One row in float32 arithmetic. `e` holds the exponentials between the second
// and the third pass: the row itself for float32, a float32 scratch row for
// bfloat16 (so that the gradient is rounded to bfloat16 once).
template <typename Element>
inline __attribute__((always_inline)) double float_row(Element* x, float* e, int64_t vocab, int64_t target,
                                                       float weight) {
  float lane_max[kVectorLanes];
  for (int l = 0; l < kVectorLanes; ++l) lane_max[l] = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kVectorLanes <= vocab; i += kVectorLanes) {
    for (int l = 0; l < kVectorLanes; ++l) {
      const float v = to_float(x[i + l]);
      lane_max[l] = v > lane_max[l] ? v : lane_max[l];
    }
  }
  float max = -std::numeric_limits<float>::infinity();
  for (int l = 0; l < kVectorLanes; ++l) max = lane_max[l] > max ? lane_max[l] : max;
  for (; i < vocab; ++i) max = to_float(x[i]) > max ? to_float(x[i]) : max;
  const float target_logit = to_float(x[target]);

  float lane_sum[kVectorLanes] = {};
  i = 0;
  for (; i + kVectorLanes <= vocab; i += kVectorLanes) {
    for (int l = 0; l < kVectorLanes; ++l) {
      const float v = exp_nonpositive(to_float(x[i + l]) - max);
      e[i + l] = v;
      lane_sum[l] += v;
    }
  }
  float sum = 0.0f;
  for (int l = 0; l < kVectorLanes; ++l) sum += lane_sum[l];
  for (; i < vocab; ++i) {
    e[i] = exp_nonpositive(to_float(x[i]) - max);
    sum += e[i];
  }

  const float scale = weight / sum;
  const float target_e = e[target];
  for (i = 0; i < vocab; ++i) x[i] = static_cast<Element>(e[i] * scale);
  x[target] = static_cast<Element>(target_e * scale - weight);
  return static_cast<double>(weight) * (std::log(static_cast<double>(sum)) + static_cast<double>(max) - target_logit);
}

GRADACCUM_VECTOR_CLONES double float32_row(float* x, int64_t vocab, int64_t target, float weight) {
  return float_row(x, x, vocab, target, weight);
}

GRADACCUM_VECTOR_CLONES double bfloat16_row(c10::BFloat16* x, float* scratch, int64_t vocab, int64_t target,
                                            float weight) {
  return float_row(x, scratch, vocab, target, weight);
}

// float64 rows are for exactness tests, not speed: plain loops with std::exp.
double float64_row(double* x, int64_t vocab, int64_t target, double weight) {
  const double max = *std::max_element(x, x + vocab);
  const double target_logit = x[target];
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const double scale = weight / sum;
  for (int64_t i = 0; i < vocab; ++i) x[i] *= scale;
  x[target] -= weight;
  return weight * (std::log(sum) + max - target_logit);
}

std::string describe(const torch::Tensor& t) {
  return fmt::format("{} {} tensor of {} dimension(s){}", t.device().str(), c10::toString(t.scalar_type()), t.dim(),
                     t.is_contiguous() ? "" : ", not contiguous");
}

}  // namespace

bool softmax_cross_entropy_supports(const torch::Tensor& logits) {
  const auto dtype = logits.scalar_type();
  return logits.defined() && logits.is_cpu() && logits.dim() == 2 && logits.is_contiguous() &&
         (dtype == torch::kFloat || dtype == torch::kBFloat16 || dtype == torch::kDouble);
}

double softmax_cross_entropy_(torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& row_weights) {
  GA_CHECK(softmax_cross_entropy_supports(logits),
           "softmax cross-entropy: logits must be a contiguous 2-D float32, bfloat16 or float64 "
           "CPU tensor, got a {}",
           logits.defined() ? describe(logits) : std::string("undefined tensor"));
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  GA_CHECK(targets.defined() && targets.is_cpu() && targets.scalar_type() == torch::kLong && targets.dim() == 1 &&
               targets.size(0) == rows,
           "softmax cross-entropy: targets must be a CPU int64 tensor of {} row(s), got a {}", rows,
           targets.defined() ? describe(targets) : std::string("undefined tensor"));
  const auto target = targets.contiguous();
  const int64_t* target_of = target.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    GA_CHECK(target_of[r] >= 0 && target_of[r] < vocab,
             "softmax cross-entropy: target {} of row {} is outside the vocabulary [0, {})", target_of[r], r, vocab);
  }
  torch::Tensor weights;
  if (row_weights.defined()) {
    GA_CHECK(row_weights.is_cpu() && row_weights.dim() == 1 && row_weights.size(0) == rows &&
                 (row_weights.scalar_type() == torch::kFloat || row_weights.scalar_type() == torch::kDouble),
             "softmax cross-entropy: row weights must be a float32 or float64 CPU tensor of {} "
             "row(s), got a {}",
             rows, describe(row_weights));
    weights = row_weights.to(torch::kDouble).contiguous();
  }
  const double* weight_of = weights.defined() ? weights.data_ptr<double>() : nullptr;

  std::vector<double> losses(static_cast<size_t>(rows), 0.0);
  const auto dtype = logits.scalar_type();
  auto* row_bytes = static_cast<char*>(logits.data_ptr());
  const int64_t element_size = logits.element_size();
  // ~32K elements per task: a row of GPT-2's vocabulary is one and a half.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(vocab, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(dtype == torch::kBFloat16 ? static_cast<size_t>(vocab) : 0);
    for (int64_t r = begin; r < end; ++r) {
      const double weight = weight_of ? weight_of[r] : 1.0;
      if (weight == 0.0) {
        // Zero in all three dtypes is all bits zero.
        std::memset(row_bytes + r * vocab * element_size, 0, vocab * element_size);
      } else if (dtype == torch::kDouble) {
        losses[r] = float64_row(logits.data_ptr<double>() + r * vocab, vocab, target_of[r], weight);
      } else if (dtype == torch::kFloat) {
        losses[r] = float32_row(logits.data_ptr<float>() + r * vocab, vocab, target_of[r], static_cast<float>(weight));
      } else {
        losses[r] = bfloat16_row(logits.data_ptr<c10::BFloat16>() + r * vocab, scratch.data(), vocab, target_of[r],
                                 static_cast<float>(weight));
      }
    }
  });
  double total = 0.0;
  for (const double loss : losses) total += loss;
  return total;
}

SoftmaxCrossEntropySum::SoftmaxCrossEntropySum(const torch::TensorOptions& options)
    : libtorch_sum_(torch::zeros({}, options)) {}

torch::Tensor SoftmaxCrossEntropySum::add(torch::Tensor& logits, const torch::Tensor& targets,
                                          const torch::Tensor& row_weights, bool gradient) {
  // The kernel computes in float32 for float32 and bfloat16 logits and in float64 for float64.
  const auto sum_dtype = libtorch_sum_.scalar_type();
  const auto kernel_dtype = logits.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  if (custom_kernel_enabled(CustomKernel::softmax_cross_entropy) && softmax_cross_entropy_supports(logits) &&
      sum_dtype == kernel_dtype) {
    // The loss and d sum / d logits = softmax - onehot(target) in one pass per row, in
    // place of the logits.
    kernel_sum_ += softmax_cross_entropy_(logits, targets, row_weights);
    return logits;
  }
  // -log softmax(logits)[target], from one log_softmax pass over the block.
  const auto target = targets.unsqueeze(1);
  auto log_probs = torch::log_softmax(logits.to(sum_dtype), 1);
  const auto picked = log_probs.gather(1, target);
  libtorch_sum_.sub_(row_weights.defined() ? picked.mul(row_weights.unsqueeze(1)).sum() : picked.sum());
  if (!gradient) return {};
  // d sum / d logits = softmax - onehot(target), in place of the log-probabilities.
  auto grad_logits = log_probs.exp_();
  grad_logits.scatter_(1, target, grad_logits.gather(1, target) - 1);
  if (row_weights.defined()) grad_logits.mul_(row_weights.unsqueeze(1));  // unscored rows contribute nothing
  return grad_logits.to(logits.scalar_type());
}

torch::Tensor SoftmaxCrossEntropySum::sum() {
  libtorch_sum_.add_(kernel_sum_);
  kernel_sum_ = 0.0;
  return libtorch_sum_;
}

}  // namespace gradaccum::kernels
