// WindowRunner's record of a step (window_runner.h): the figures the observers see, read back
// from the device in the step's one host synchronization.
#include <cmath>

#include "gradaccum/base/check.h"
#include "gradaccum/core/grad_flow.h"
#include "gradaccum/core/window_runner.h"
#include "gradaccum/optim/grad_clip.h"

namespace gradaccum::core {

// The step's figures in one device-to-host copy: the record, the summed totals (which the
// features read: the agreed stop flag) and the gradient flow. A non-finite loss aborts here under
// nan_policy: abort.
StepRecord WindowRunner::make_record(const WindowState& w, const WindowTotals& totals, const WindowLoss& window_loss,
                                     const StepResult& step, bool skip, const torch::Tensor& flow_statistics) {
  const Window& window = w.window;
  const int64_t world = sync_.world_size();
  StepRecord record;
  record.lr = step.lr;
  record.skipped = skip || step.overflow;
  record.loss_scale = step.loss_scale;

  const auto device = window_loss.loss.device();
  constexpr int64_t kStepFigures = 5;
  const auto packed_totals = totals.pack();
  auto figures = torch::cat({torch::stack({window_loss.loss, window_loss.count, step.grad_norm.to(device),
                                           step.grad_norm_clipped.to(device), sync_.weight_norm(params_).to(device)}),
                             packed_totals.to(device)});
  const bool flow = flow_statistics.defined();
  if (flow) figures = torch::cat({figures, flow_statistics.flatten().to(figures.device())});
  auto host = figures.to(torch::kCPU);
  auto v = host.accessor<double, 1>();
  record.loss = v[0];
  record.items = static_cast<int64_t>(std::llround(v[1]));
  record.grad_norm = v[2];
  record.grad_norm_clipped = v[3];
  record.weight_norm = v[4];
  const auto read = WindowTotals::unpack(host.narrow(0, kStepFigures, packed_totals.numel()), totals.layout());
  for (auto* f : features_) f->after_host_read(read);
  record.step = steps_.step();
  if (w.micro_items_known) {
    const auto items = read.micro_step_items.accessor<double, 1>();
    for (int64_t s = 0; s < window.micro_steps(); ++s) record.micro_step_items.push_back(std::llround(items[s]));
  }
  if (world > 1) {
    const auto items = read.rank_items.accessor<double, 1>();
    for (int64_t r = 0; r < world; ++r) record.rank_items.push_back(std::llround(items[r]));
  }
  record.loss_normalization = to_string(options_.loss_normalization);
  if (flow) {
    const auto p = static_cast<int64_t>(params_.size());
    const int64_t first = kStepFigures + packed_totals.numel();
    observer_.on_grad_flow(
        grad_flow_record(record.step, param_names_, host.slice(0, first, first + 3 * p).view({p, 3})));
  }
  // A non-finite loss is a divergence, not an fp16 overflow (losses are float32
  // under every precision), so it aborts even when the scaler skipped the step.
  if (!std::isfinite(record.loss) && options_.nan_policy == NanPolicy::abort) {
    int64_t bad = -1;
    for (size_t i = 0; i < w.micro_sums.size() && bad < 0; ++i) {
      if (w.micro_sums[i].defined() && !torch::isfinite(w.micro_sums[i]).item<bool>()) {
        bad = w.first_micro_step + static_cast<int64_t>(i);
      }
    }
    throw Error(
        fmt::format("non-finite loss at optimizer step {} (micro-step {} of {}; epoch {}, window {}); "
                    "nan_policy: abort stops here, nan_policy: skip would skip such steps",
                    record.step, bad >= 0 ? fmt::format("{}", bad) : std::string("?"), window.micro_steps(),
                    window.epoch(), window.index()));
  }
  record.epoch = window.epoch();
  record.samples = window.size();
  record.micro_steps = window.micro_steps();
  record.micro_batch_size = plan_.geometry().micro_batch();
  record.padded_tokens = window.padded_tokens();
  record.sample_tokens = window.sample_tokens();
  record.gradient_accumulation_steps =
      options_.window_tokens > 0 ? window.micro_steps() : plan_.geometry().accumulation_steps();
  record.world_size = world;
  record.allreduce_calls = sync_.allreduce_calls();
  record.allreduce_bytes = sync_.allreduce_bytes();
  record.all_gather_calls = sync_.all_gather_calls();
  record.sharded_grad_sync = sync_.sharded_policy();
  return record;
}

}  // namespace gradaccum::core
