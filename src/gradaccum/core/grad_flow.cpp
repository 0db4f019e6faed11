#include "gradaccum/core/grad_flow.h"

#include "gradaccum/base/check.h"

namespace gradaccum::core {

torch::Tensor grad_flow_statistics(const std::vector<torch::Tensor>& params) {
  GA_CHECK(!params.empty(), "gradient flow of no parameters");
  const auto options = torch::TensorOptions(torch::kDouble).device(params.front().device());
  std::vector<torch::Tensor> rows;
  rows.reserve(params.size());
  for (const auto& p : params) {
    const auto& g = p.grad();
    if (!g.defined() || g.numel() == 0) {
      rows.push_back(torch::tensor({0.0, 0.0, 1.0}, options));
      continue;
    }
    // Sums accumulate in float64 without a float64 copy of the gradient.
    const auto magnitude = g.detach().abs();
    const double n = static_cast<double>(g.numel());
    rows.push_back(torch::stack({magnitude.sum(torch::kDouble) / n, magnitude.max().to(torch::kDouble),
                                 (magnitude == 0).sum(torch::kDouble) / n}));
  }
  return torch::stack(rows);
}

GradFlowRecord grad_flow_record(int64_t step, const std::vector<std::string>& names, const torch::Tensor& statistics) {
  GA_CHECK(statistics.dim() == 2 && statistics.size(0) == static_cast<int64_t>(names.size()) &&
               statistics.size(1) == 3 && statistics.is_cpu() && statistics.scalar_type() == torch::kDouble,
           "gradient flow: expected [{}, 3] float64 statistics on the CPU", names.size());
  GradFlowRecord r;
  r.step = step;
  r.names = names;
  const auto s = statistics.accessor<double, 2>();
  for (int64_t i = 0; i < statistics.size(0); ++i) {
    r.mean_abs.push_back(s[i][0]);
    r.max_abs.push_back(s[i][1]);
    r.zero_fraction.push_back(s[i][2]);
  }
  return r;
}

}  // namespace gradaccum::core
