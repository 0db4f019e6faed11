#include "gradaccum/core/window_runner.h"

#include <chrono>

#include "gradaccum/base/seconds.h"
#include "gradaccum/core/grad_flow.h"
#include "gradaccum/core/mixed_precision.h"

namespace gradaccum::core {

namespace {
using base::Clock;
using base::seconds_since;
}  // namespace

WindowRunner::WindowRunner(const TrainerOptions& options, Trainable& model, const Dataset& data, GradSync& sync,
                           const WindowPlan& plan, std::vector<torch::Tensor> params,
                           std::vector<std::string> param_names, LossNormalizer& normalizer, StepSequence& steps,
                           GradAccumulator& accumulator, std::vector<WindowFeature*> features,
                           TrainingObserver& observer)
    : options_(options),
      model_(model),
      data_(data),
      sync_(sync),
      plan_(plan),
      params_(std::move(params)),
      param_names_(std::move(param_names)),
      normalizer_(normalizer),
      steps_(steps),
      accumulator_(accumulator),
      features_(std::move(features)),
      observer_(observer) {}

std::optional<StepRecord> WindowRunner::run(const Window& window, int64_t first_micro_step, bool stoppable) {
  const auto start = Clock::now();
  WindowState w(window, steps_.step(), first_micro_step);
  w.stoppable = stoppable;
  normalizer_.begin_window();
  for (auto* f : features_) f->begin_window(w);

  // 1. The micro-steps: fetch, forward, backward of the loss sum. Communication starts only
  //    inside the last backward.
  for (int64_t s = first_micro_step; s < window.micro_steps(); ++s) {
    const bool last = s + 1 == window.micro_steps();
    for (auto* f : features_) {
      if (f->stop_before_micro_step(w, s, last)) return std::nullopt;
    }
    sync_.before_backward(last);
    micro_step(w, s);
    sync_.after_backward(last);
  }

  // 2. One all-reduce: the gradients, then the window's totals riding along.
  auto totals = reduce(w);
  for (auto* f : features_) f->after_reduce(totals, w);

  // 3. One division by the window's global count makes every gradient exact (the gradient as
  //    this rank holds it: whole, or its shard).
  const auto gradients = sync_.gradients(params_);
  const auto window_loss = normalizer_.finish(totals.loss, gradients, sync_.world_size(), w.loss_multiplier);

  // 4. The optimizer step: (fp16 inf check) → clip → step → zero grads → schedule; or, for
  //    nan_policy: skip, zero grads → schedule. Gradient flow reads the gradient it is given.
  const bool flow = options_.grad_flow_steps > 0 && (steps_.step() + 1) % options_.grad_flow_steps == 0;
  const auto flow_statistics = flow ? grad_flow_statistics(params_) : torch::Tensor();
  const bool skip = options_.nan_policy == NanPolicy::skip &&
                    !torch::isfinite(window_loss.loss).item<bool>();  // the extra sync skip mode costs
  const StepResult step = skip ? steps_.skip() : steps_.apply(gradients, sync_.global_norm(gradients));

  // 5. The step's record, read in the step's one host synchronization.
  auto record = make_record(w, totals, window_loss, step, skip, flow_statistics);
  record.step_time_s = seconds_since(start);
  record.data_time_s = w.data_time;
  record.samples_per_s = static_cast<double>(record.samples) / record.step_time_s;
  record.items_per_s = static_cast<double>(record.items) / record.step_time_s;
  return record;
}

// Micro-step s of this rank: its samples' loss sum, backward of the normalizer's objective. A
// rank may have no samples left in a partial window, or a feature may take the micro-step's
// error (out of memory): it then computes nothing but still takes part in the collectives.
void WindowRunner::micro_step(WindowState& w, int64_t s) {
  const auto fetch_start = Clock::now();
  const auto indices = w.window.micro_batch(s, sync_.rank());
  if (indices.size(0) > 0 && !w.gave_up) {
    try {
      auto batch = fetch(indices, w.id + 1);
      w.data_time += seconds_since(fetch_start);
      LossSum micro;
      {
        AutocastScope autocast(options_.mixed_precision, options_.device);
        micro = model_.loss(batch);
      }
      auto objective = normalizer_.objective(micro);
      if (w.loss_multiplier != 1.0) objective = objective * w.loss_multiplier;
      objective.backward();
      w.micro_sums.push_back(micro.sum.detach());
      w.micro_items.push_back(micro.count.detach().to(torch::kDouble));
      accumulator_.after_backward();
      return;
    } catch (const std::exception& e) {
      bool taken = false;
      for (auto* f : features_) taken = taken || f->absorb_micro_step_error(e, w, s);
      if (!taken) throw;
      sync_.abandon_micro_step();
    }
  }
  w.micro_sums.emplace_back();
  w.micro_items.push_back(torch::zeros({}, torch::TensorOptions(torch::kDouble).device(options_.device)));
  accumulator_.skip_micro_step();
}

// This rank's totals, then GradSync's one all-reduce of the gradients and the totals. On the
// training device: a rank whose share of a partial window is empty holds its zero totals on the
// CPU, and NCCL reduces CUDA tensors only.
WindowTotals WindowRunner::reduce(WindowState& w) {
  const int64_t rank = sync_.rank(), world = sync_.world_size();
  const auto local = normalizer_.local_totals().to(options_.device);
  WindowTotals totals;
  totals.loss = local;
  totals.stop_requests = torch::zeros({}, local.options());
  totals.out_of_memory_ranks = torch::zeros({}, local.options());
  totals.save_requests = torch::zeros({}, local.options());
  totals.micro_step_items = w.micro_items_known ? torch::stack(w.micro_items).to(local.device())
                                                : torch::zeros({w.window.micro_steps()}, local.options());
  totals.rank_items = torch::zeros({world}, local.options());
  totals.rank_items.narrow(0, rank, 1).copy_(local.narrow(0, 1, 1));
  for (auto* f : features_) f->contribute(totals, w);
  const auto layout = totals.layout();
  auto packed = totals.pack();
  sync_.finish_window(packed);
  return WindowTotals::unpack(packed, layout);
}

Batch WindowRunner::fetch(const torch::Tensor& indices, int64_t step) const {
  auto batch = data_.get(indices, options_.dtype);
  batch.keys = SampleKeys{indices, step, options_.seed};
  // To a GPU from page-locked memory, the copy is queued like a kernel; from
  // pageable memory the host would wait for the device before copying, on every
  // micro-step (the batches are small: pinning them costs a host copy).
  const bool non_blocking = options_.device.is_cuda();
  // Skips the dispatcher round trip of a no-op .to() when the batch is already
  // there (CPU training), on every micro-step.
  auto to_device = [&](torch::Tensor& t) {
    if (!t.defined() || t.device() == options_.device) return;
    if (non_blocking && t.is_cpu() && !t.is_pinned()) t = t.pin_memory();
    t = t.to(options_.device, non_blocking);
  };
  to_device(batch.input);
  to_device(batch.target);
  to_device(batch.attention_mask);
  to_device(batch.keys.ids);  // per-sample dropout reads them on the device
  return batch;
}

}  // namespace gradaccum::core
