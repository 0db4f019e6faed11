// What a window's one all-reduce carries beside the gradients, field by field.
//
// Every rank fills its own figures, pack() lays them out in one float64 vector, the gradient
// sync sums that vector over ranks (GradSync::finish_window) and unpack() reads the sums back
// into the same fields. Sums are what each field needs: counts add up, a flag summed over ranks
// is the number of ranks that raised it, and a vector that holds this rank's figure at its own
// index (zeros elsewhere) becomes every rank's figure. This is the one place that knows the
// offsets; the record of a step reads the fields by name (DESIGN.md §1: the totals travel in
// the window's all-reduce, so stopping and accounting cost no extra collective).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace gradaccum::core {

// The sizes that fix the packed layout: both sides of the all-reduce agree on them.
struct WindowTotalsLayout {
  int64_t micro_steps = 0;  // the window's micro-steps (N, or fewer in a partial window)
  int64_t world_size = 1;
  int64_t slots = 0;  // deterministic accumulation: the window's N × W micro-batch slots; else 0

  int64_t packed_size() const { return 6 + micro_steps + world_size + 2 * slots; }
  bool operator==(const WindowTotalsLayout& other) const {
    return micro_steps == other.micro_steps && world_size == other.world_size && slots == other.slots;
  }
};

struct WindowTotals {
  // LossNormalizer's totals in its own layout (local_totals(): Σ loss sums, Σ counts, Σ naive
  // terms; float64 [3]).
  torch::Tensor loss;
  // Ranks that asked to stop, and ranks that ran out of memory in this window (0-dim float64).
  torch::Tensor stop_requests;
  torch::Tensor out_of_memory_ranks;
  // Ranks whose clock says a timed checkpoint is due (SaveClock, 0-dim float64).
  torch::Tensor save_requests;
  // Each micro-step's item count ([micro_steps]), and each rank's Σ counts ([world_size]: this
  // rank's at its index before the reduce).
  torch::Tensor micro_step_items;
  torch::Tensor rank_items;
  // Deterministic accumulation: each slot's loss sum and count ([slots]; this rank's slots
  // filled, the others zero), added afterwards in the canonical tree. Undefined without it.
  torch::Tensor slot_loss_sums;
  torch::Tensor slot_counts;

  WindowTotalsLayout layout() const;
  // One 1-D float64 tensor on the fields' device, in the layout's order.
  torch::Tensor pack() const;
  // The fields of `packed` (pack()'s output, possibly summed over ranks; on any device), as
  // views into it. Throws gradaccum::Error when its size is not the layout's.
  static WindowTotals unpack(const torch::Tensor& packed, const WindowTotalsLayout& layout);
};

// The value of a one-element CPU tensor (a field of totals read back to the host), read from its
// memory: no operator runs, so the host-read count of the step stays what it was.
double host_value(const torch::Tensor& t);

}  // namespace gradaccum::core
