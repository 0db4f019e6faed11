#include "gradaccum/core/grad_flow.h"

#include "gradaccum/base/check.h"

namespace gradaccum::core {

torch::Tensor grad_flow_statistics(const std::vector<torch::Tensor>& params) {
  GA_CHECK(!params.empty(), "gradient flow of no parameters");
  const auto options = torch::TensorOptions(torch::kDouble).device(params.front().device());
  std::vector<torch::Tensor> grads;
  std::vector<int64_t> rows_of_grads;
  grads.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& g = params[i].grad();
    if (g.defined() && g.numel() > 0) {
      grads.push_back(g.detach());
      rows_of_grads.push_back(static_cast<int64_t>(i));
    }
  }
  // A parameter without a gradient reads 0, 0 and all zeros.
  auto rows = torch::tensor({0.0, 0.0, 1.0}, options).repeat({static_cast<int64_t>(params.size()), 1});
  if (grads.empty()) return rows;
  // No copy of a whole gradient: |g| is summed in its own dtype by ATen's cascaded sum
  // (float32-accurate, unlike its 1-norm kernel) over cache-sized slices, the largest |g| comes
  // from one min-max pass, and count_nonzero counts without a boolean tensor. Float64 copies
  // cost the CNN's default run 7% of its step (bench/op_profile.py --workload cnn --split 16x4);
  // an unsliced |g| of BLOOM-560m's embedding was 0.6 GB of its peak (BENCHMARKS.md). On the
  // CPU a slice fits in cache; elsewhere every slice costs two kernel launches (GPT-2 small's
  // gradients are 1900 slices of 64K), so it is as large as a 64 MB float32 |g| allows.
  const int64_t slice_numel = params.front().is_cpu() ? int64_t{1} << 16 : int64_t{1} << 24;
  std::vector<torch::Tensor> l1, max, nonzero;
  std::vector<double> numel;
  for (const auto& g : grads) {
    std::vector<torch::Tensor> partial;  // one slice for most parameters
    for (const auto& slice : g.reshape(-1).split(slice_numel)) partial.push_back(slice.abs().sum());
    l1.push_back(torch::stack(partial).to(torch::kDouble).sum());
    const auto [lo, hi] = torch::aminmax(g);
    max.push_back(torch::maximum(-lo, hi).to(torch::kDouble));
    nonzero.push_back(torch::count_nonzero(g));
    numel.push_back(static_cast<double>(g.numel()));
  }
  const auto n = torch::tensor(numel, options);
  const auto zero_fraction = (n - torch::stack(nonzero).to(torch::kDouble)) / n;  // exact counts
  const auto index = torch::tensor(rows_of_grads, torch::TensorOptions(torch::kLong).device(options.device()));
  rows.index_copy_(0, index, torch::stack({torch::stack(l1) / n, torch::stack(max), zero_fraction}, 1));
  return rows;
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
