#include "gradaccum/core/window_totals.h"

#include <vector>

#include "gradaccum/base/check.h"

namespace gradaccum::core {

namespace {
int64_t length_of(const torch::Tensor& t) { return t.defined() ? t.numel() : 0; }
}  // namespace

WindowTotalsLayout WindowTotals::layout() const {
  return {length_of(micro_step_items), length_of(rank_items), length_of(slot_loss_sums)};
}

torch::Tensor WindowTotals::pack() const {
  GA_CHECK(length_of(slot_counts) == length_of(slot_loss_sums), "window totals: {} slot loss sums but {} slot counts",
           length_of(slot_loss_sums), length_of(slot_counts));
  GA_CHECK(loss.defined() && loss.numel() == 3, "window totals: the loss totals are not LossNormalizer's 3 values");
  const auto options = loss.options().dtype(torch::kDouble);
  auto field = [&](const torch::Tensor& t) { return t.to(options).reshape({-1}); };
  std::vector<torch::Tensor> parts{field(loss),          field(stop_requests),    field(out_of_memory_ranks),
                                   field(save_requests), field(micro_step_items), field(rank_items)};
  if (slot_loss_sums.defined()) {
    parts.push_back(field(slot_loss_sums));
    parts.push_back(field(slot_counts));
  }
  return torch::cat(parts);
}

WindowTotals WindowTotals::unpack(const torch::Tensor& packed, const WindowTotalsLayout& layout) {
  GA_CHECK(packed.dim() == 1 && packed.numel() == layout.packed_size(),
           "window totals: {} values where the layout ({} micro-steps, {} ranks, {} slots) holds {}", packed.numel(),
           layout.micro_steps, layout.world_size, layout.slots, layout.packed_size());
  int64_t at = 0;
  auto next = [&](int64_t n) {
    auto part = packed.narrow(0, at, n);
    at += n;
    return part;
  };
  WindowTotals totals;
  totals.loss = next(3);
  totals.stop_requests = next(1).squeeze(0);
  totals.out_of_memory_ranks = next(1).squeeze(0);
  totals.save_requests = next(1).squeeze(0);
  totals.micro_step_items = next(layout.micro_steps);
  totals.rank_items = next(layout.world_size);
  if (layout.slots > 0) {
    totals.slot_loss_sums = next(layout.slots);
    totals.slot_counts = next(layout.slots);
  }
  return totals;
}

double host_value(const torch::Tensor& t) {
  GA_CHECK(t.defined() && t.is_cpu() && t.numel() == 1 && t.scalar_type() == torch::kDouble,
           "host_value: wants one float64 value on the CPU");
  return *t.const_data_ptr<double>();
}

}  // namespace gradaccum::core
