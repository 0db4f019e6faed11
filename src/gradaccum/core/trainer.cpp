#include "gradaccum/core/trainer.h"

#include <chrono>
#include <cmath>

#include "gradaccum/base/check.h"
#include "gradaccum/base/seconds.h"
#include "gradaccum/core/evaluator.h"
#include "gradaccum/core/saved_geometry.h"

namespace gradaccum::core {

namespace {
using base::Clock;
using base::seconds_since;
}  // namespace

optim::NamedParameters Trainer::named_parameters() const {
  optim::NamedParameters named;
  for (const auto& item : model_.module().named_parameters()) {
    if (item.value().requires_grad()) named.emplace_back(item.key(), item.value());
  }
  return named;
}

void place_module(torch::nn::Module& module, const torch::Device& device, torch::ScalarType dtype) {
  module.to(device);
  auto convert = [dtype](torch::Tensor& t) {
    if (t.is_floating_point() && t.scalar_type() != dtype) t.set_data(t.to(dtype));
  };
  for (auto& p : module.parameters()) {
    const bool frozen_16_bit =
        !p.requires_grad() && (p.scalar_type() == torch::kBFloat16 || p.scalar_type() == torch::kHalf);
    if (!frozen_16_bit) convert(p);
  }
  for (auto& b : module.buffers()) convert(b);
}

namespace {
// The options' decomposition, after every rule that ties the options together held.
BatchGeometry validated_geometry(const TrainerOptions& options, int64_t world_size) {
  validate(options, world_size);
  return options.geometry(world_size);
}
}  // namespace

int64_t total_optimizer_steps(const TrainerOptions& options, const WindowPlan& plan) {
  return options.max_steps > 0 ? options.max_steps : plan.windows_in_epochs(options.num_train_epochs);
}

Trainer::Trainer(TrainerOptions options, Trainable& model, const Dataset& train_data, const Dataset* eval_data,
                 TrainingObserver& observer, GradSync* sync, std::unique_ptr<torch::optim::Optimizer> optimizer)
    : options_(std::move(options)),
      model_(model),
      train_data_(train_data),
      eval_data_(eval_data),
      observer_(observer),
      sync_(sync != nullptr ? *sync : local_sync_),
      plan_(train_data.size(), validated_geometry(options_, sync_.world_size()), options_.last_window, options_.seed,
            options_.sample_order),
      total_steps_(total_optimizer_steps(options_, plan_)),
      normalizer_(options_.loss_normalization, plan_.geometry().accumulation_steps()) {
  place_module(model_.module(), options_.device, options_.dtype);
  model_.module().train();
  for (auto& [name, p] : named_parameters()) {
    params_.push_back(p);
    param_names_.push_back(name);
  }
  GA_CHECK(!params_.empty(), "the model has no trainable parameters");
  // Before the plan's other settings: the tree's contiguous chunk order rules some of them out.
  if (options_.deterministic_accumulation) {
    accumulator_ = std::make_unique<DeterministicAccumulation>(params_, plan_, sync_.rank(), options_.device);
  } else {
    accumulator_ = std::make_unique<PlainGradAccumulator>();
  }
  // Lengths serve the padding figures, longest_first, grouping and token budgets alike.
  const auto lengths = train_data_.sample_lengths();
  if (lengths.defined()) plan_.set_lengths(lengths);
  plan_.set_token_budget(options_.max_tokens_per_micro_batch);
  if (options_.group_by_length) {
    GA_CHECK(lengths.defined(), "option 'group_by_length': the training data's samples have no length");
    plan_.group_by_length(lengths);
  }
  if (options_.window_tokens > 0) {
    plan_.set_window_tokens(options_.window_tokens, train_data_.sample_items());
    total_steps_ = total_optimizer_steps(options_, plan_);
  }
  optimizer_ = optimizer ? std::move(optimizer) : optim::make_optimizer(options_.optimizer, params_);
  const int64_t warmup =
      options_.warmup_steps > 0
          ? options_.warmup_steps
          : static_cast<int64_t>(std::ceil(options_.warmup_ratio * static_cast<double>(total_steps_)));
  loss_scaling_.emplace(options_.mixed_precision, options_.loss_scaler, train_data_, plan_.geometry().micro_batch());
  preemption_.emplace(params_, normalizer_, options_.device,
                      accumulator_->can_stop_inside_window() && sync_.can_stop_inside_window());
  oom_recovery_.emplace(options_.oom_recovery, options_.max_tokens_per_micro_batch, params_, sync_.rank(),
                        sync_.world_size(), options_.device);
  steps_ = std::make_unique<StepSequence>(
      *optimizer_, params_,
      optim::LrSchedule(options_.lr_scheduler_type, options_.optimizer.learning_rate, warmup, total_steps_),
      options_.max_grad_norm, loss_scaling_->scaler());
  save_clock_.emplace(options_.save_interval_s);
  pieces_ = {&*loss_scaling_, &*preemption_, accumulator_.get(), &*oom_recovery_, &*save_clock_};
  runner_ = std::make_unique<WindowRunner>(options_, model_, train_data_, sync_, plan_, params_, param_names_,
                                           normalizer_, *steps_, *accumulator_, pieces_, observer_);
}

std::optional<EvalRecord> Trainer::evaluate_on_rank0() {
  std::optional<EvalRecord> eval;
  sync_.with_whole_parameters([&] {
    if (sync_.rank() == 0) {
      eval = evaluate(model_, *eval_data_, options_.per_device_eval_batch_size, options_.dtype, options_.device,
                      options_.mixed_precision);
    }
  });
  return eval;
}

void Trainer::use_geometry(const BatchGeometry& geometry) {
  plan_.set_geometry(geometry);
  normalizer_ = LossNormalizer(options_.loss_normalization, geometry.accumulation_steps());
  loss_scaling_->set_micro_batch(geometry.micro_batch());
}

void Trainer::restore(const TrainingState& saved_state) {
  const auto saved = SavedGeometry::restore(saved_state);
  // A run that shrank its micro-batch after running out of memory goes on with it.
  if (auto shrunk = oom_recovery_->resumed_geometry(saved_state, saved.geometry, plan_.geometry())) {
    use_geometry(*shrunk);
  }
  // Saved inside a window under another b × N × W (an elastic restart at another world size):
  // its partial sums do not fit this decomposition, so the window starts over.
  TrainingState state = saved_state;
  if (state.position.micro_step > 0 && !saved.continues_inside_window(plan_.geometry())) state.position.micro_step = 0;
  saved.check_continues(state, plan_.geometry(), options_.window_tokens);
  GA_CHECK(state.position.step <= total_steps_, "checkpoint: it is at step {}, beyond this run's {} steps",
           state.position.step, total_steps_);
  // With carry, windows are numbered across epochs (the step count bounds them above).
  GA_CHECK(plan_.carries() || state.position.window < plan_.windows_in_epoch(state.position.epoch),
           "checkpoint: window {} does not exist in an epoch of {} windows", state.position.window,
           plan_.windows_in_epoch(state.position.epoch));
  GA_CHECK(state.position.schedule_step <= state.position.step, "checkpoint: schedule step {} is beyond step {}",
           state.position.schedule_step, state.position.step);
  for (auto* piece : pieces_) piece->restore(state);
  position_ = state.position;
  position_.micro_step = preemption_->resumed_micro_step();  // this rank's own
  steps_->resume_at(position_.step, position_.schedule_step);
}

void Trainer::set_checkpointing(CheckpointHook* hook, const std::atomic<bool>* stop, StopAgreement* agreement) {
  hook_ = hook;
  preemption_->arm(stop, agreement != nullptr ? agreement : (sync_.world_size() == 1 ? &local_stop_ : nullptr));
}

TrainingState Trainer::state_at(const TrainingPosition& position) const {
  TrainingState state;
  state.position = position;
  SavedGeometry{plan_.geometry(), options_.window_tokens}.save(state);
  for (const auto* piece : pieces_) piece->save(state);
  return state;
}

StepRecord Trainer::train_window(const Window& window) { return *runner_->run(window, 0, /*stoppable=*/false); }

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
  TrainingPosition& pos = position_;
  const int64_t samples_before = pos.samples, items_before = pos.items;
  // The stream the carried windows are cut from ends with the run's last epoch, or never when
  // max_steps bounds the run.
  const int64_t stream_epochs = options_.max_steps > 0 ? 0 : options_.num_train_epochs;
  auto advance = [&] {
    pos.micro_step = 0;
    if (plan_.carries()) {  // windows are numbered across epochs
      pos.epoch = plan_.epoch_of_carried_window(++pos.window);
    } else if (++pos.window == plan_.windows_in_epoch(pos.epoch)) {
      pos.window = 0;
      ++pos.epoch;
    }
  };
  while (steps_->step() < total_steps_ && !summary.preempted) {
    const int64_t epoch = pos.epoch;
    const auto permutation = plan_.carries() ? torch::Tensor() : plan_.permutation(epoch);
    while ((plan_.carries() || pos.epoch == epoch) && steps_->step() < total_steps_) {
      const auto window = plan_.carries() ? plan_.carried_window(pos.window, stream_epochs)
                                          : plan_.window(permutation, pos.epoch, pos.window);
      std::optional<StepRecord> outcome;
      try {
        outcome = runner_->run(window, pos.micro_step, /*stoppable=*/hook_ != nullptr);
      } catch (const WindowOutOfMemory& oom) {
        // The same window again, from its first micro-step, in smaller micro-batches.
        const int64_t step = steps_->step() + 1;
        const auto from = plan_.geometry();
        const auto to = oom_recovery_->shrink(oom, from, step);
        observer_.on_micro_batch_change({step, from.micro_batch(), from.accumulation_steps(), to.micro_batch(),
                                         to.accumulation_steps(), oom.bytes()});
        use_geometry(to);
        pos.micro_step = 0;
        preemption_->forget_partial_window();
        continue;
      }
      if (!outcome) {  // stopped inside the window: save it as it is
        hook_->save(state_at(pos), SaveReason::preempted);
        summary.preempted = true;
        break;
      }
      auto record = *outcome;
      record.time_s = seconds_since(start);
      pos.step = record.step;
      pos.schedule_step = steps_->schedule_step();
      pos.loss_total += record.loss;
      pos.samples += record.samples;
      pos.items += record.items;
      summary.final_loss = record.loss;
      advance();
      observer_.on_step(record);
      const bool last_step = record.step == total_steps_;
      if (eval_data_ != nullptr && !last_step && options_.eval_steps > 0 && record.step % options_.eval_steps == 0) {
        if (auto eval = evaluate_on_rank0()) {
          eval->step = record.step;
          observer_.on_eval(*eval);
        }
      }
      if (hook_ != nullptr) {
        if (preemption_->stop_agreed() && !last_step) {
          hook_->save(state_at(pos), SaveReason::preempted);
          summary.preempted = true;
          break;
        }
        if (last_step) {
          hook_->save(state_at(pos), SaveReason::final);
        } else if ((options_.save_steps > 0 && record.step % options_.save_steps == 0) || save_clock_->due()) {
          hook_->save(state_at(pos), SaveReason::periodic);
          save_clock_->saved();
        }
      }
    }
  }
  summary.steps = steps_->step();
  summary.samples = pos.samples;
  summary.items = pos.items;
  summary.wall_s = seconds_since(start);
  summary.train_loss = summary.steps > 0 ? pos.loss_total / static_cast<double>(summary.steps) : 0.0;
  // The rates of what this call trained: a resumed run's earlier samples took no time here.
  summary.samples_per_s = static_cast<double>(pos.samples - samples_before) / summary.wall_s;
  summary.items_per_s = static_cast<double>(pos.items - items_before) / summary.wall_s;
  if (eval_data_ != nullptr && !summary.preempted) {
    if (auto eval = evaluate_on_rank0()) {
      summary.eval = *eval;
      summary.eval.step = summary.steps;
      summary.has_eval = true;
      observer_.on_eval(summary.eval);
    }
  }
  observer_.on_end(summary);
  return summary;
}

}  // namespace gradaccum::core
