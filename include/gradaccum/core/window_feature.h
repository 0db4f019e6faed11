// A concern of the window that is not the accumulation itself, as a piece beside the loop.
//
// The window loop (window_runner.h) holds only fetch → forward → backward of the loss sum →
// sync on the last micro-step → normalize once → clip → step. Preemption inside a window, OOM
// recovery, deterministic accumulation and loss scaling each live in a WindowFeature of their
// own: the loop calls every feature at the same few points, in the order they were added, and a
// feature owns its rules, its fields of the window's totals and its part of a checkpoint.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <exception>
#include <vector>

#include "gradaccum/core/training_state.h"
#include "gradaccum/core/window_plan.h"
#include "gradaccum/core/window_totals.h"

namespace gradaccum::core {

// One window's running state on this rank, from its first micro-step to its all-reduce.
struct WindowState {
  WindowState(const Window& w, int64_t window_id, int64_t first) : window(w), id(window_id), first_micro_step(first) {}

  const Window& window;
  int64_t id;                    // the optimizer step this window becomes (0-based), unique within a run
  int64_t first_micro_step;      // > 0: a window stopped inside and resumed there
  bool stoppable = false;        // the caller can save the window if it stops between micro-steps
  double loss_multiplier = 1.0;  // each objective is multiplied by it; normalization divides it out once
  double data_time = 0.0;        // seconds spent fetching and moving batches
  // Each micro-step's loss sum and item count, on the device (undefined sum: the micro-step
  // computed nothing on this rank). Detached: holding the graph's root would keep tensors that
  // some nodes hold outside their saved variables alive until the window ends (+96 MB peak RSS
  // on the 3.4M GPT, bench/lm_throughput).
  std::vector<torch::Tensor> micro_sums;
  std::vector<torch::Tensor> micro_items;
  bool micro_items_known = true;  // false after a resume from a checkpoint that lacks them
  // A feature took a micro-step's error: this rank computes nothing more in this window but still
  // takes part in its collectives.
  bool gave_up = false;
};

class WindowFeature {
 public:
  virtual ~WindowFeature() = default;
  // Before the window's first micro-step run here.
  virtual void begin_window(WindowState&) {}
  // Before micro-step `s` (`last`: it is the window's last). True stops the window here; the
  // feature keeps what a checkpoint of the partial window needs.
  virtual bool stop_before_micro_step(const WindowState&, int64_t /*s*/, bool /*last*/) { return false; }
  // Micro-step `s` threw `error`. True when the feature takes it: the micro-step then counts as
  // one without samples on this rank. A feature may also rethrow something of its own.
  virtual bool absorb_micro_step_error(const std::exception& /*error*/, WindowState&, int64_t /*s*/) { return false; }
  // Fills its fields of this rank's totals before the window's all-reduce.
  virtual void contribute(WindowTotals&, WindowState&) {}
  // The totals summed over ranks (on the device), before the window's normalization.
  virtual void after_reduce(WindowTotals&, WindowState&) {}
  // The summed totals as the step's one host read brought them back.
  virtual void after_host_read(const WindowTotals&) {}
  // Its part of a checkpoint, and back (restore runs before the first window).
  virtual void save(TrainingState&) const {}
  virtual void restore(const TrainingState&) {}
};

// How a window's micro-step gradients add up: in .grad by autograd itself, or kept apart and
// added in a fixed order (canonical_sum.h). The loop tells it after each backward.
class GradAccumulator : public WindowFeature {
 public:
  // The micro-step's backward has run.
  virtual void after_backward() {}
  // This rank had no samples for the micro-step (or gave it up): it ran no backward.
  virtual void skip_micro_step() {}
  // Whether a window stopped between micro-steps can be saved and continued bit-identically.
  virtual bool can_stop_inside_window() const { return true; }
};

// Autograd adds each backward into the parameters' .grad: nothing to do.
class PlainGradAccumulator final : public GradAccumulator {};

}  // namespace gradaccum::core
