// Stopping a run that was asked to stop (SIGTERM/SIGINT), and continuing it bit-identically.
//
// Between micro-steps the window in flight may stop where the StopAgreement allows it
// (stop_agreement.h): this piece then keeps the partial window (the gradient sums so far, the
// normalizer's running totals, each micro-step's items) for the checkpoint, and a resumed run
// puts them back before the window's remaining micro-steps, which then add exactly as the
// uninterrupted window did. A stop that cannot happen inside the window happens at its end: the
// request travels in the window's totals (stop_requests), so every rank learns of it in the
// all-reduce it makes anyway, and the run loop stops after the step (stop_agreed()).
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "gradaccum/core/loss_normalizer.h"
#include "gradaccum/core/stop_agreement.h"
#include "gradaccum/core/window_feature.h"
#include "gradaccum/core/window_plan.h"

namespace gradaccum::core {

// A window interrupted after `micro_step` micro-steps on this rank: the gradient sums so far and
// the normalizer's running [Σ sum, Σ count, Σ naive]. Resuming puts both back and runs the
// remaining micro-steps: the same additions in the same order, so the window's result is
// bit-identical.
struct PartialWindow {
  int64_t micro_step = 0;
  torch::Tensor totals;  // float64 [3]
  // float64 [micro_step]: each micro-step's item count, for the window's record (undefined when
  // it was not known: the record then leaves them out).
  torch::Tensor micro_items;
  std::vector<torch::Tensor> grads;  // per trainable parameter; undefined = no gradient yet

  // As the tensors of Preemption's piece: micro_step, grad_count, totals, micro_items and
  // grad.<i> (the defined ones).
  void save(PieceState& piece) const;
  // Checks every tensor (one-line errors naming the file and the tensor).
  static PartialWindow restore(const PieceState& piece);
};

class Preemption final : public WindowFeature {
 public:
  static constexpr const char* kPiece = "preemption";

  // `params` are the trainable parameters whose .grad the window accumulates; every reference
  // must outlive this object. `inside_windows`: false when a window's partial sums cannot be
  // saved (deterministic accumulation's tree, ZeRO-2 reducing every micro-step into its shard):
  // a stop then waits for the window's end.
  Preemption(std::vector<torch::Tensor> params, LossNormalizer& normalizer, torch::Device device, bool inside_windows);

  // `stop`: the flag a stop request raises (may be null: never asked). `agreement`: where ranks
  // may stop inside a window (null: only at a window's end).
  void arm(const std::atomic<bool>* stop, StopAgreement* agreement);
  bool requested() const { return stop_ != nullptr && stop_->load(); }
  // The last window's summed stop flag was raised: the run stops after that step.
  bool stop_agreed() const { return stop_agreed_; }

  void begin_window(WindowState& w) override;
  bool stop_before_micro_step(const WindowState& w, int64_t s, bool last) override;
  void contribute(WindowTotals& totals, WindowState& w) override;
  void after_reduce(WindowTotals& totals, WindowState& w) override;
  void after_host_read(const WindowTotals& totals) override;
  // A window stopped inside: its micro-step (the position's) and partial sums (its piece's).
  void save(TrainingState& state) const override;
  // Checks that a state saved inside a window can be continued here, and keeps its sums for
  // the first window (that the decomposition is the same is SavedGeometry::check_continues').
  void restore(const TrainingState& state) override;
  // The micro-step this rank's first window continues from (0: from its start).
  int64_t resumed_micro_step() const { return resume_.micro_step; }
  // The partial window a state holds for this rank (empty: none).
  static PartialWindow partial_window(const TrainingState& state);
  // Drops what restore() kept (the window is trained again from its first micro-step).
  void forget_partial_window() { resume_ = PartialWindow{}; }

 private:
  std::vector<torch::Tensor> params_;
  LossNormalizer& normalizer_;
  torch::Device device_;
  const std::atomic<bool>* stop_ = nullptr;
  StopAgreement* agreement_ = nullptr;  // null: no stop inside a window
  bool inside_windows_;
  bool stop_agreed_ = false;
  int64_t stopped_after_ = 0;  // > 0: the window in flight stopped after this many micro-steps
  bool stopped_ = false;
  PartialWindow stopped_partial_;  // what the stopped window accumulated
  PartialWindow resume_;           // a restored state's partial window, for the first window
};

}  // namespace gradaccum::core
