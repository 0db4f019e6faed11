// Out-of-memory recovery inside a window (out_of_memory.h says what it promises).
//
// A micro-step that cannot allocate is taken here: alone, the rank drops the window's partial
// gradients and throws WindowOutOfMemory at once; with several ranks it computes nothing more in
// the window but still takes part in its collectives, and the flag it raises travels in the
// window's totals (out_of_memory_ranks), so every rank learns of it before anything steps and
// all throw together. The Trainer then trains the same window again with shrink()'s smaller
// micro-batch, and a checkpoint remembers it so that a resumed run keeps it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradaccum/core/batch_geometry.h"
#include "gradaccum/core/out_of_memory.h"
#include "gradaccum/core/window_feature.h"

namespace gradaccum::core {

class OomRecovery final : public WindowFeature {
 public:
  static constexpr const char* kPiece = "oom_recovery";

  // `enabled`: the oom_recovery option; `max_tokens_per_micro_batch` > 0 cannot shrink (the
  // budget, not b, sizes micro-batches).
  OomRecovery(bool enabled, int64_t max_tokens_per_micro_batch, std::vector<torch::Tensor> params, int64_t rank,
              int64_t world_size, torch::Device device);

  void begin_window(WindowState& w) override;
  bool absorb_micro_step_error(const std::exception& error, WindowState& w, int64_t s) override;
  void contribute(WindowTotals& totals, WindowState& w) override;
  // Several ranks: the one read of the summed flag per window; throws if any rank ran out.
  void after_reduce(WindowTotals& totals, WindowState& w) override;
  // Whether the micro-batch in use came from a recovery.
  void save(TrainingState& state) const override;

  // The decomposition to go on with after `oom` at optimizer step `step` (cached memory released
  // first); throws gradaccum::Error when there is none.
  BatchGeometry shrink(const WindowOutOfMemory& oom, const BatchGeometry& from, int64_t step);
  // The smaller micro-batch a resumed run goes on with: `saved` (the state's geometry), when it
  // came from a recovery and is a smaller micro-batch of `current`'s global batch and world.
  std::optional<BatchGeometry> resumed_geometry(const TrainingState& state, const BatchGeometry& saved,
                                                const BatchGeometry& current);

 private:
  // The window's partial gradients are dropped: it is trained again.
  void drop_gradients();

  bool enabled_;
  int64_t max_tokens_per_micro_batch_;
  std::vector<torch::Tensor> params_;
  int64_t rank_, world_size_;
  torch::Device device_;
  bool shrunk_ = false;  // the micro-batch in use came from a recovery
  // This window on this rank:
  bool out_of_memory_ = false;
  std::string message_;
  int64_t bytes_ = 0;
};

}  // namespace gradaccum::core
