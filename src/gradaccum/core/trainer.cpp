#include "gradaccum/core/trainer.h"

#include <chrono>
#include <cmath>

#include "gradaccum/core/check.h"
#include "gradaccum/core/evaluator.h"
#include "gradaccum/optim/grad_clip.h"

namespace gradaccum::core {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::vector<torch::Tensor> trainable_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> params;
  for (auto& p : module.parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  return params;
}
}  // namespace

BatchGeometry TrainerOptions::geometry(int64_t world_size) const {
  if (global_batch_size > 0) {
    return BatchGeometry::from_global(per_device_train_batch_size, global_batch_size, world_size);
  }
  return BatchGeometry::from_accumulation(per_device_train_batch_size, gradient_accumulation_steps,
                                          world_size);
}

int64_t total_optimizer_steps(const TrainerOptions& options, const WindowPlan& plan) {
  if (options.max_steps > 0) return options.max_steps;
  GA_CHECK(options.num_train_epochs >= 1, "num_train_epochs must be >= 1, got {}",
           options.num_train_epochs);
  return options.num_train_epochs * plan.windows_per_epoch();
}

Trainer::Trainer(TrainerOptions options, Trainable& model, const Dataset& train_data,
                 const Dataset* eval_data, TrainingObserver& observer, GradSync* sync,
                 std::unique_ptr<torch::optim::Optimizer> optimizer)
    : options_(std::move(options)),
      model_(model),
      train_data_(train_data),
      eval_data_(eval_data),
      observer_(observer),
      sync_(sync != nullptr ? *sync : local_sync_),
      plan_(train_data.size(), options_.geometry(sync_.world_size()), options_.last_window,
            options_.seed),
      total_steps_(total_optimizer_steps(options_, plan_)),
      normalizer_(options_.loss_normalization, plan_.geometry().accumulation_steps()) {
  model_.module().to(options_.device, options_.dtype);
  model_.module().train();
  params_ = trainable_parameters(model_.module());
  GA_CHECK(!params_.empty(), "the model has no trainable parameters");
  optimizer_ = optimizer ? std::move(optimizer) : optim::make_optimizer(options_.optimizer, params_);
  const int64_t warmup =
      options_.warmup_steps > 0
          ? options_.warmup_steps
          : static_cast<int64_t>(std::ceil(options_.warmup_ratio * static_cast<double>(total_steps_)));
  steps_ = std::make_unique<StepSequence>(
      *optimizer_, params_,
      optim::LrSchedule(options_.lr_scheduler_type, options_.optimizer.learning_rate, warmup,
                        total_steps_),
      options_.max_grad_norm);
}

core::Batch Trainer::fetch(const torch::Tensor& indices) const {
  auto batch = train_data_.get(indices, options_.dtype);
  const bool non_blocking = options_.device.is_cuda();
  // Skips the dispatcher round trip of a no-op .to() when the batch is already
  // there (CPU training), on every micro-step.
  auto to_device = [&](torch::Tensor& t) {
    if (t.defined() && t.device() != options_.device) t = t.to(options_.device, non_blocking);
  };
  to_device(batch.input);
  to_device(batch.target);
  to_device(batch.attention_mask);
  return batch;
}

StepRecord Trainer::train_window(const Window& window) {
  const auto start = Clock::now();
  double data_time = 0.0;
  const int64_t rank = sync_.rank();

  normalizer_.begin_window();
  for (int64_t s = 0; s < window.micro_steps(); ++s) {
    const bool last = s + 1 == window.micro_steps();
    const auto fetch_start = Clock::now();
    const auto indices = window.micro_batch(s, rank);
    sync_.before_backward(last);  // communication only on the last micro-step
    if (indices.size(0) > 0) {  // a rank may have no samples left in a partial window
      auto batch = fetch(indices);
      data_time += seconds_since(fetch_start);
      normalizer_.objective(model_.loss(batch)).backward();
    }
    sync_.after_backward(last);
  }
  // Every gradient now holds this rank's Σ over micro-steps; after the sync,
  // the Σ over ranks. One division by the global count makes it exact.
  auto totals = normalizer_.local_totals();
  sync_.finish_window(totals);
  const auto window_loss = normalizer_.finish(totals, params_, sync_.world_size());

  StepRecord record;
  const auto step = steps_->apply();  // clip → step → zero grads → schedule
  record.lr = step.lr;

  // The one host synchronization of the step.
  auto host = torch::stack({window_loss.loss, window_loss.count, step.grad_norm,
                            step.grad_norm_clipped, optim::global_weight_norm(params_)})
                  .to(torch::kCPU);
  auto v = host.accessor<double, 1>();
  record.loss = v[0];
  record.items = static_cast<int64_t>(std::llround(v[1]));
  record.grad_norm = v[2];
  record.grad_norm_clipped = v[3];
  record.weight_norm = v[4];
  record.step = steps_->step();
  record.epoch = window.epoch();
  record.samples = window.size();
  record.micro_steps = window.micro_steps();
  record.world_size = sync_.world_size();
  record.allreduce_calls = sync_.allreduce_calls();
  record.allreduce_bytes = sync_.allreduce_bytes();
  record.step_time_s = seconds_since(start);
  record.data_time_s = data_time;
  record.samples_per_s = static_cast<double>(record.samples) / record.step_time_s;
  record.items_per_s = static_cast<double>(record.items) / record.step_time_s;
  return record;
}

TrainSummary Trainer::run() {
  RunInfo info{plan_.geometry()};
  info.total_steps = total_steps_;
  info.windows_per_epoch = plan_.windows_per_epoch();
  info.train_samples = train_data_.size();
  info.eval_samples = eval_data_ != nullptr ? eval_data_->size() : 0;
  for (const auto& p : params_) info.parameters += p.numel();
  observer_.on_start(info);

  TrainSummary summary;
  const auto start = Clock::now();
  double loss_total = 0.0;
  for (int64_t epoch = 0; steps_->step() < total_steps_; ++epoch) {
    const auto permutation = plan_.permutation(epoch);
    for (int64_t k = 0; k < plan_.windows_per_epoch() && steps_->step() < total_steps_; ++k) {
      auto record = train_window(plan_.window(permutation, epoch, k));
      record.time_s = seconds_since(start);
      loss_total += record.loss;
      summary.samples += record.samples;
      summary.items += record.items;
      summary.final_loss = record.loss;
      observer_.on_step(record);
      const bool last_step = record.step == total_steps_;
      if (eval_data_ != nullptr && !last_step && options_.eval_steps > 0 &&
          record.step % options_.eval_steps == 0) {
        auto eval = evaluate(model_, *eval_data_, options_.per_device_eval_batch_size,
                             options_.dtype, options_.device);
        eval.step = record.step;
        observer_.on_eval(eval);
      }
    }
  }
  summary.steps = steps_->step();
  summary.wall_s = seconds_since(start);
  summary.train_loss = summary.steps > 0 ? loss_total / static_cast<double>(summary.steps) : 0.0;
  summary.samples_per_s = static_cast<double>(summary.samples) / summary.wall_s;
  summary.items_per_s = static_cast<double>(summary.items) / summary.wall_s;
  if (eval_data_ != nullptr) {
    summary.eval = evaluate(model_, *eval_data_, options_.per_device_eval_batch_size,
                            options_.dtype, options_.device);
    summary.eval.step = summary.steps;
    summary.has_eval = true;
    observer_.on_eval(summary.eval);
  }
  observer_.on_end(summary);
  return summary;
}

}  // namespace gradaccum::core
