#include "gradaccum/core/trainer.h"

#include <chrono>
#include <cmath>

#include "gradaccum/base/check.h"
#include "gradaccum/core/canonical_sum.h"
#include "gradaccum/core/evaluator.h"
#include "gradaccum/core/grad_flow.h"
#include "gradaccum/optim/grad_clip.h"

namespace gradaccum::core {

namespace {
// fp16: each micro-step's loss sum is multiplied by scale / items, with items a power of two near a
// micro-batch's item count (trainer.h's fp16_items_).
double fp16_items_for(const Dataset& data, int64_t micro_batch) {
  double items_per_sample = 1.0;
  if (const auto lengths = data.sample_lengths(); lengths.defined() && lengths.numel() > 0) {
    items_per_sample = std::max(1.0, lengths.to(torch::kDouble).mean().item<double>() - 1.0);
  }
  const double items = items_per_sample * static_cast<double>(micro_batch);
  return std::exp2(std::floor(std::log2(std::max(1.0, items))));
}
}  // namespace

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

optim::NamedParameters Trainer::named_parameters() const {
  optim::NamedParameters named;
  for (const auto& item : model_.module().named_parameters()) {
    if (item.value().requires_grad()) named.emplace_back(item.key(), item.value());
  }
  return named;
}

BatchGeometry TrainerOptions::geometry(int64_t world_size) const {
  if (window_tokens > 0) {
    GA_CHECK(global_batch_size == 0,
             "key 'global_batch_size': cannot be combined with window_tokens (the windows are measured in tokens)");
    return BatchGeometry::from_accumulation(per_device_train_batch_size, 1, world_size);
  }
  if (global_batch_size > 0) {
    return BatchGeometry::from_global(per_device_train_batch_size, global_batch_size, world_size);
  }
  return BatchGeometry::from_accumulation(per_device_train_batch_size, gradient_accumulation_steps, world_size);
}

int64_t total_optimizer_steps(const TrainerOptions& options, const WindowPlan& plan) {
  if (options.max_steps > 0) return options.max_steps;
  GA_CHECK(options.num_train_epochs >= 1, "num_train_epochs must be >= 1, got {}", options.num_train_epochs);
  return plan.windows_in_epochs(options.num_train_epochs);
}

Trainer::Trainer(TrainerOptions options, Trainable& model, const Dataset& train_data, const Dataset* eval_data,
                 TrainingObserver& observer, GradSync* sync, std::unique_ptr<torch::optim::Optimizer> optimizer)
    : options_(std::move(options)),
      model_(model),
      train_data_(train_data),
      eval_data_(eval_data),
      observer_(observer),
      sync_(sync != nullptr ? *sync : local_sync_),
      plan_(train_data.size(), options_.geometry(sync_.world_size()), options_.last_window, options_.seed,
            options_.sample_order),
      total_steps_(total_optimizer_steps(options_, plan_)),
      normalizer_(options_.loss_normalization, plan_.geometry().accumulation_steps()) {
  if (options_.deterministic_accumulation) {
    const int64_t world = plan_.geometry().world_size();
    GA_CHECK((world & (world - 1)) == 0, "deterministic_accumulation: the world size must be a power of two, not {}",
             world);
    GA_CHECK(options_.loss_normalization != LossNormalization::micro_batch,
             "deterministic_accumulation: needs loss_normalization window or sum, not micro_batch");
    plan_.set_chunk_order(ChunkOrder::contiguous);
  }
  // Lengths serve the padding figures, longest_first, grouping and token budgets alike.
  const auto lengths = train_data_.sample_lengths();
  if (lengths.defined()) plan_.set_lengths(lengths);
  plan_.set_token_budget(options_.max_tokens_per_micro_batch);
  if (options_.group_by_length) {
    GA_CHECK(lengths.defined(), "key 'data.group_by_length': this dataset's samples have no length");
    plan_.group_by_length(lengths);
  }
  if (options_.window_tokens > 0) {
    GA_CHECK(options_.loss_normalization != LossNormalization::micro_batch,
             "key 'window_tokens': needs loss_normalization window or sum, not micro_batch (N varies per window)");
    plan_.set_window_tokens(options_.window_tokens, train_data_.sample_items());
    total_steps_ = total_optimizer_steps(options_, plan_);
  }
  model_.module().to(options_.device, options_.dtype);
  model_.module().train();
  for (auto& [name, p] : named_parameters()) {
    params_.push_back(p);
    param_names_.push_back(name);
  }
  GA_CHECK(!params_.empty(), "the model has no trainable parameters");
  optimizer_ = optimizer ? std::move(optimizer) : optim::make_optimizer(options_.optimizer, params_);
  const int64_t warmup =
      options_.warmup_steps > 0
          ? options_.warmup_steps
          : static_cast<int64_t>(std::ceil(options_.warmup_ratio * static_cast<double>(total_steps_)));
  if (options_.mixed_precision != MixedPrecision::none) {
    GA_CHECK(options_.dtype == torch::kFloat,
             "key 'mixed_precision': {} keeps parameters in float32 and needs dtype: float32",
             to_string(options_.mixed_precision));
  }
  if (options_.mixed_precision == MixedPrecision::fp16) {
    scaler_.emplace(options_.loss_scaler);
    fp16_items_ = fp16_items_for(train_data_, plan_.geometry().micro_batch());
  }
  steps_ = std::make_unique<StepSequence>(
      *optimizer_, params_,
      optim::LrSchedule(options_.lr_scheduler_type, options_.optimizer.learning_rate, warmup, total_steps_),
      options_.max_grad_norm, scaler_ ? &*scaler_ : nullptr);
}

void Trainer::use_geometry(const BatchGeometry& geometry) {
  plan_.set_geometry(geometry);
  normalizer_ = LossNormalizer(options_.loss_normalization, geometry.accumulation_steps());
  if (scaler_) fp16_items_ = fp16_items_for(train_data_, geometry.micro_batch());
}

void Trainer::shrink_micro_batch(const WindowOutOfMemory& oom, int64_t step) {
  GA_CHECK(options_.max_tokens_per_micro_batch == 0,
           "out of memory at optimizer step {} with max_tokens_per_micro_batch {}: lower it ({})", step,
           options_.max_tokens_per_micro_batch, oom.what());
  const auto from = plan_.geometry();
  const auto to = smaller_micro_batch(from);
  GA_CHECK(to.has_value(), "out of memory at optimizer step {} with a micro-batch of 1 sample{}: {}", step,
           oom.bytes() > 0
               ? fmt::format(" (it asked for {:.1f} MiB more)", static_cast<double>(oom.bytes()) / (1024.0 * 1024.0))
               : std::string(),
           oom.what());
  observer_.on_micro_batch_change(
      {step, from.micro_batch(), from.accumulation_steps(), to->micro_batch(), to->accumulation_steps(), oom.bytes()});
  release_cached_memory(options_.device);
  use_geometry(*to);
  micro_batch_from_oom_recovery_ = true;
}

core::Batch Trainer::fetch(const torch::Tensor& indices, int64_t step) const {
  auto batch = train_data_.get(indices, options_.dtype);
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

void Trainer::restore(const TrainingState& state) {
  // A run that shrank its micro-batch after running out of memory goes on with it.
  if (state.micro_batch_from_oom_recovery && state.global_batch == plan_.geometry().global_batch() &&
      state.world_size == plan_.geometry().world_size() && state.micro_batch < plan_.geometry().micro_batch()) {
    use_geometry(BatchGeometry::from_accumulation(state.micro_batch, state.accumulation_steps, state.world_size));
    micro_batch_from_oom_recovery_ = true;
  }
  const auto& g = plan_.geometry();
  GA_CHECK(state.window_tokens == options_.window_tokens,
           "checkpoint: it was saved with window_tokens {} and this run has {}", state.window_tokens,
           options_.window_tokens);
  GA_CHECK(options_.window_tokens > 0 || state.global_batch == g.global_batch(),
           "checkpoint: it was saved with global batch {} and this run has {}", state.global_batch, g.global_batch());
  GA_CHECK(state.position.step <= total_steps_, "checkpoint: it is at step {}, beyond this run's {} steps",
           state.position.step, total_steps_);
  // With carry, windows are numbered across epochs (the step count bounds them above).
  GA_CHECK(plan_.carries() || state.position.window < plan_.windows_in_epoch(state.position.epoch),
           "checkpoint: window {} does not exist in an epoch of {} windows", state.position.window,
           plan_.windows_in_epoch(state.position.epoch));
  GA_CHECK(state.position.micro_step == 0 || !options_.deterministic_accumulation,
           "checkpoint: it was saved inside a window (micro-step {}), whose sums deterministic_accumulation "
           "cannot continue in its tree order; resume it without deterministic_accumulation",
           state.position.micro_step);
  if (state.position.micro_step > 0) {
    // The partial sums belong to particular micro-batches of particular ranks.
    GA_CHECK(state.micro_batch == g.micro_batch() && state.accumulation_steps == g.accumulation_steps() &&
                 state.world_size == g.world_size(),
             "checkpoint: it was saved inside a window with {}x{}x{} (b x N x W); resume it with the "
             "same decomposition, not {}x{}x{}",
             state.micro_batch, state.accumulation_steps, state.world_size, g.micro_batch(), g.accumulation_steps(),
             g.world_size());
    GA_CHECK(state.partial.grads.size() == params_.size() && state.partial.totals.defined(),
             "checkpoint: the partial window holds {} gradients for {} parameters", state.partial.grads.size(),
             params_.size());
  }
  GA_CHECK(state.position.schedule_step <= state.position.step, "checkpoint: schedule step {} is beyond step {}",
           state.position.schedule_step, state.position.step);
  if (scaler_ && state.loss_scaler) {
    scaler_->restore(*state.loss_scaler);
  } else if (state.position.micro_step > 0) {
    // The partial gradients carry the saved run's loss scale (or none).
    GA_CHECK(static_cast<bool>(scaler_) == static_cast<bool>(state.loss_scaler),
             "checkpoint: it was saved inside a window {} fp16; resume it with the same "
             "mixed_precision",
             state.loss_scaler ? "with" : "without");
  }
  position_ = state.position;
  resume_partial_ = state.partial;
  steps_->resume_at(position_.step, position_.schedule_step);
}

void Trainer::set_checkpointing(CheckpointHook* hook, const std::atomic<bool>* stop, StopAgreement* agreement) {
  hook_ = hook;
  stop_ = stop;
  agreement_ = agreement != nullptr ? agreement : (sync_.world_size() == 1 ? &local_stop_ : nullptr);
  // The canonical tree's partial sums are not checkpointed: stop at the window's end.
  if (options_.deterministic_accumulation) agreement_ = nullptr;
}

std::vector<torch::Tensor> Trainer::take_gradients() {
  std::vector<torch::Tensor> gradients;
  gradients.reserve(params_.size());
  for (auto& p : params_) {
    gradients.push_back(p.grad());
    p.mutable_grad() = torch::Tensor();
  }
  return gradients;
}

TrainingState Trainer::state_at(const TrainingPosition& position) const {
  TrainingState state;
  state.position = position;
  const auto& g = plan_.geometry();
  state.micro_batch = g.micro_batch();
  state.accumulation_steps = g.accumulation_steps();
  state.world_size = g.world_size();
  state.global_batch = g.global_batch();
  state.window_tokens = options_.window_tokens;
  state.micro_batch_from_oom_recovery = micro_batch_from_oom_recovery_;
  if (scaler_) state.loss_scaler = scaler_->state();
  return state;
}

StepRecord Trainer::train_window(const Window& window) { return *run_window(window, 0, nullptr); }

// One window's running state on this rank, from its first micro-step to its all-reduce.
struct Trainer::WindowSums {
  int64_t first_micro_step = 0;  // > 0: a preempted window resumed there
  bool may_stop_inside = false;  // preemption may stop this window between micro-steps
  double loss_multiplier = 1.0;  // fp16: scale / fp16_items_; finish() divides it out once
  double data_time = 0.0;
  // Each micro-step's item count and loss sum, on the device: the counts for the record, the
  // sums read only when the window loss is not finite. Detached: holding the graph's root would
  // keep tensors that some nodes hold outside their saved variables alive until the window ends
  // (+96 MB peak RSS on the 3.4M GPT, bench/lm_throughput).
  std::vector<torch::Tensor> micro_items;
  bool micro_items_known = true;  // false after a resume from a checkpoint that lacks them
  std::vector<torch::Tensor> micro_sums;
  // oom_recovery: this rank ran out of memory in this window.
  bool out_of_memory = false;
  std::string oom_message;
  int64_t oom_bytes = 0;
  // deterministic_accumulation: each micro-step's gradient kept apart and added in the canonical
  // tree over this rank's N slots (canonical_sum.h).
  std::optional<CanonicalGradientSum> tree;
};

// What the window's one all-reduce carried, summed over ranks:
//   [loss sum, count, naive terms, stop flag, out-of-memory flag, N micro-step items, W rank items]
// (`accounted` values), then under deterministic_accumulation each slot's loss sum and count.
struct Trainer::WindowTotals {
  torch::Tensor values;
  int64_t accounted = 0;
  int64_t slot_values = 0;  // 2 x slots x world, or 0
};

std::optional<StepRecord> Trainer::run_window(const Window& window, int64_t first_micro_step, PartialWindow* partial) {
  const auto start = Clock::now();
  const int64_t window_id = steps_->step();  // the optimizer step this window becomes
  WindowSums sums;
  sums.first_micro_step = first_micro_step;
  sums.may_stop_inside = partial != nullptr && stop_ != nullptr && agreement_ != nullptr;
  begin_window(sums);

  // 1. The micro-steps: fetch, forward, backward. Gradients add up in .grad (or in the tree);
  //    communication happens only inside the last backward.
  for (int64_t s = first_micro_step; s < window.micro_steps(); ++s) {
    const bool last = s + 1 == window.micro_steps();
    if (stop_inside_window(sums, window_id, s, last, partial)) return std::nullopt;
    sync_.before_backward(last);
    run_micro_step(window, s, window_id, sums);
    sync_.after_backward(last);
  }

  // 2. One all-reduce: gradients, then the loss totals with the stop and out-of-memory flags and
  //    the window's accounting riding along.
  const auto totals = reduce_window(window, sums);
  if (sums.may_stop_inside) agreement_->window_finished(window_id);
  throw_if_any_rank_ran_out_of_memory(totals, sums);

  // 3. One division by the window's global count makes every gradient exact.
  const auto window_loss = normalizer_.finish(totals.values, params_, sync_.world_size(), sums.loss_multiplier);

  // 4. The optimizer step: (fp16 inf check) → clip → step → zero grads → schedule; or, for
  //    nan_policy: skip, zero grads → schedule. Gradient flow reads the gradient it is given.
  const bool flow = options_.grad_flow_steps > 0 && (steps_->step() + 1) % options_.grad_flow_steps == 0;
  const auto flow_statistics = flow ? grad_flow_statistics(params_) : torch::Tensor();
  const bool skip = options_.nan_policy == NanPolicy::skip &&
                    !torch::isfinite(window_loss.loss).item<bool>();  // the extra sync skip mode costs
  const StepResult step = skip ? steps_->skip() : steps_->apply();

  // 5. The step's record, read in the step's one host synchronization.
  auto record = make_record(window, totals, sums, window_loss, step, skip, flow_statistics);
  record.step_time_s = seconds_since(start);
  record.data_time_s = sums.data_time;
  record.samples_per_s = static_cast<double>(record.samples) / record.step_time_s;
  record.items_per_s = static_cast<double>(record.items) / record.step_time_s;
  return record;
}

void Trainer::begin_window(WindowSums& sums) {
  normalizer_.begin_window();
  // fp16: every micro-step's objective is multiplied by this; finish() divides
  // it out of the gradients once, in the same pass as the normalization.
  sums.loss_multiplier = scaler_ ? scaler_->scale() / fp16_items_ : 1.0;
  if (sums.first_micro_step > 0) {  // a preempted window: put its sums back
    normalizer_.restore(resume_partial_.totals.to(options_.device));
    const auto& restored = resume_partial_.micro_items;
    sums.micro_items_known = restored.defined() && restored.numel() == sums.first_micro_step;
    for (int64_t s = 0; sums.micro_items_known && s < sums.first_micro_step; ++s) {
      sums.micro_items.push_back(restored[s].to(options_.device, torch::kDouble));
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& g = resume_partial_.grads[i];
      if (g.defined()) params_[i].mutable_grad() = g.to(params_[i].device(), params_[i].scalar_type()).clone();
    }
    resume_partial_ = PartialWindow{};
  }
  if (options_.deterministic_accumulation) {
    sums.tree.emplace(plan_.geometry().accumulation_steps());
    take_gradients();  // what the last optimizer step left (zeros) is no slot's
  }
}

// Preemption between micro-steps: asked before each micro-step but the first one run here, and
// always before the last (with several ranks, entering it commits to the all-reduce). On a stop,
// *partial receives what the window has accumulated.
bool Trainer::stop_inside_window(const WindowSums& sums, int64_t window_id, int64_t s, bool last,
                                 PartialWindow* partial) {
  if (!sums.may_stop_inside || !(s > sums.first_micro_step || last) ||
      !agreement_->stop_here(window_id, stop_requested(), last)) {
    return false;
  }
  if (s > 0) {  // micro-step 0 has accumulated nothing: a plain checkpoint
    partial->totals = normalizer_.local_totals().to(torch::kCPU);
    if (sums.micro_items_known) partial->micro_items = torch::stack(sums.micro_items).to(torch::kCPU);
    for (const auto& p : params_) {
      partial->grads.push_back(p.grad().defined() ? p.grad().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true)
                                                  : torch::Tensor());
    }
  }
  stopped_after_ = s;
  return true;
}

// Micro-step s of this rank: its samples' loss sum, backward of the normalizer's objective.
// A rank may have no samples left in a partial window; one that ran out of memory computes
// nothing more in this window but still takes part in its collectives.
void Trainer::run_micro_step(const Window& window, int64_t s, int64_t window_id, WindowSums& sums) {
  const auto fetch_start = Clock::now();
  const auto indices = window.micro_batch(s, sync_.rank());
  bool computed = false;
  if (indices.size(0) > 0 && !sums.out_of_memory) {
    try {
      auto batch = fetch(indices, window_id + 1);
      sums.data_time += seconds_since(fetch_start);
      LossSum micro;
      {
        AutocastScope autocast(options_.mixed_precision, options_.device);
        micro = model_.loss(batch);
      }
      auto objective = normalizer_.objective(micro);
      if (scaler_) objective = objective * sums.loss_multiplier;
      objective.backward();
      sums.micro_sums.push_back(micro.sum.detach());
      sums.micro_items.push_back(micro.count.detach().to(torch::kDouble));
      if (sums.tree) sums.tree->add(take_gradients());
      computed = true;
    } catch (const std::exception& e) {
      if (!options_.oom_recovery || !is_out_of_memory(e)) throw;
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      const std::string message = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
      sums.out_of_memory = true;
      sums.oom_message = fmt::format("micro-step {} of {} with micro-batch {}: {}", s, window.micro_steps(),
                                     indices.size(0), message.substr(0, message.find('\n')));
      sums.oom_bytes = requested_bytes(message);
      if (sync_.world_size() == 1) {
        take_gradients();  // the window's partial sums are dropped; it is trained again
        throw WindowOutOfMemory(sums.oom_message, sums.oom_bytes);
      }
    }
  }
  if (!computed) {
    sums.micro_sums.emplace_back();
    sums.micro_items.push_back(torch::zeros({}, torch::TensorOptions(torch::kDouble).device(options_.device)));
    if (sums.tree) sums.tree->skip();
  }
}

// Every gradient holds this rank's Σ over micro-steps; after the sync, the Σ over ranks. The stop
// flag rides along in the same all-reduce. On the training device: a rank whose share of a
// partial window is empty holds its zero totals on the CPU, and NCCL reduces CUDA tensors only.
// Behind them ride the window's accounting: each micro-step's items (summed over ranks by the
// same all-reduce) and a vector holding this rank's items at its index (each rank's, after it).
Trainer::WindowTotals Trainer::reduce_window(const Window& window, WindowSums& sums) {
  const int64_t rank = sync_.rank(), world = sync_.world_size();
  // The slots of this rank's share of a partial window's missing chunks, then the tree's root.
  torch::Tensor slot_totals;
  if (sums.tree) {
    const int64_t slots = plan_.geometry().accumulation_steps();
    for (int64_t s = window.micro_steps(); s < slots; ++s) sums.tree->skip();
    auto root = sums.tree->finish();
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].mutable_grad() = root.empty() ? torch::Tensor() : std::move(root[i]);
    }
    // Each slot's loss sum and count, this rank's at its slots: summed over ranks they are
    // exact (one rank holds each slot), and every rank then adds them in the canonical tree.
    const int64_t first = window.slot(0, rank), all = slots * world;
    slot_totals = torch::cat({slot_vector(sums.micro_sums, first, all, options_.device),
                              slot_vector(sums.micro_items, first, all, options_.device)});
  }
  auto local = normalizer_.local_totals().to(options_.device);
  const auto per_micro_step = sums.micro_items_known ? torch::stack(sums.micro_items).to(local.device())
                                                     : torch::zeros({window.micro_steps()}, local.options());
  auto per_rank = torch::zeros({world}, local.options());
  per_rank.narrow(0, rank, 1).copy_(local.narrow(0, 1, 1));
  WindowTotals totals;
  totals.values =
      torch::cat({local, torch::full({1}, stop_requested() ? 1.0 : 0.0, local.options()),
                  torch::full({1}, sums.out_of_memory ? 1.0 : 0.0, local.options()), per_micro_step, per_rank});
  totals.accounted = totals.values.numel();
  if (slot_totals.defined()) {
    totals.slot_values = slot_totals.numel();
    totals.values = torch::cat({totals.values, slot_totals.to(local.options())});
  }
  sync_.finish_window(totals.values);
  if (totals.slot_values > 0) {
    // The window's loss sum and count in the canonical tree, in place of the ranks' running totals.
    const int64_t all = totals.slot_values / 2;
    totals.values.narrow(0, 0, 1).copy_(canonical_sum(totals.values.narrow(0, totals.accounted, all)).reshape({1}));
    totals.values.narrow(0, 1, 1).copy_(
        canonical_sum(totals.values.narrow(0, totals.accounted + all, all)).reshape({1}));
  }
  return totals;
}

// Whether any rank ran out of memory, known to every rank before anything steps: the one read
// this costs per window (a device-to-host copy of one value on a GPU), with several ranks only.
void Trainer::throw_if_any_rank_ran_out_of_memory(const WindowTotals& totals, WindowSums& sums) {
  if (!options_.oom_recovery || sync_.world_size() == 1) return;
  const auto flag = totals.values.narrow(0, 4, 1).to(torch::kCPU);
  if (flag.accessor<double, 1>()[0] > 0.0) {
    take_gradients();
    throw WindowOutOfMemory(sums.out_of_memory ? sums.oom_message : "another rank ran out of memory", sums.oom_bytes);
  }
}

// The step's figures in one device-to-host copy: the record, the agreed stop flag (stop_agreed_)
// and the gradient flow. A non-finite loss aborts here under nan_policy: abort.
StepRecord Trainer::make_record(const Window& window, const WindowTotals& totals, const WindowSums& sums,
                                const WindowLoss& window_loss, const StepResult& step, bool skip,
                                const torch::Tensor& flow_statistics) {
  const int64_t world = sync_.world_size(), steps_in_window = window.micro_steps();
  StepRecord record;
  record.lr = step.lr;
  record.skipped = skip || step.overflow;
  record.loss_scale = step.loss_scale;

  const auto device = window_loss.loss.device();
  auto figures =
      torch::cat({torch::stack({window_loss.loss, window_loss.count, step.grad_norm.to(device),
                                step.grad_norm_clipped.to(device), optim::global_weight_norm(params_).to(device)}),
                  totals.values.slice(0, 3, totals.accounted)});
  const bool flow = flow_statistics.defined();
  if (flow) figures = torch::cat({figures, flow_statistics.flatten().to(figures.device())});
  auto host = figures.to(torch::kCPU);
  auto v = host.accessor<double, 1>();
  record.loss = v[0];
  record.items = static_cast<int64_t>(std::llround(v[1]));
  record.grad_norm = v[2];
  record.grad_norm_clipped = v[3];
  record.weight_norm = v[4];
  stop_agreed_ = v[5] > 0.0;
  record.step = steps_->step();
  // figures: 5 step values, the stop and out-of-memory flags, steps_in_window micro-step items,
  // world rank items, then the gradient flow.
  const int64_t accounting = 7;
  if (sums.micro_items_known) {
    for (int64_t s = 0; s < steps_in_window; ++s) record.micro_step_items.push_back(std::llround(v[accounting + s]));
  }
  if (world > 1) {
    for (int64_t r = 0; r < world; ++r) record.rank_items.push_back(std::llround(v[accounting + steps_in_window + r]));
  }
  record.loss_normalization = to_string(options_.loss_normalization);
  if (flow) {
    const auto p = static_cast<int64_t>(params_.size());
    const int64_t first = accounting + steps_in_window + world;
    observer_.on_grad_flow(
        grad_flow_record(record.step, param_names_, host.slice(0, first, first + 3 * p).view({p, 3})));
  }
  // A non-finite loss is a divergence, not an fp16 overflow (losses are float32
  // under every precision), so it aborts even when the scaler skipped the step.
  if (!std::isfinite(record.loss) && options_.nan_policy == NanPolicy::abort) {
    int64_t bad = -1;
    for (size_t i = 0; i < sums.micro_sums.size() && bad < 0; ++i) {
      if (sums.micro_sums[i].defined() && !torch::isfinite(sums.micro_sums[i]).item<bool>()) {
        bad = sums.first_micro_step + static_cast<int64_t>(i);
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
  TrainingPosition& pos = position_;
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
      PartialWindow partial;
      std::optional<StepRecord> outcome;
      try {
        outcome = run_window(window, pos.micro_step, hook_ != nullptr ? &partial : nullptr);
      } catch (const WindowOutOfMemory& oom) {
        // The same window again, from its first micro-step, in smaller micro-batches.
        shrink_micro_batch(oom, steps_->step() + 1);
        pos.micro_step = 0;
        resume_partial_ = PartialWindow{};
        continue;
      }
      if (!outcome) {  // stopped inside the window: save it as it is
        auto state = state_at(pos);
        state.position.micro_step = stopped_after_;
        if (stopped_after_ > 0) state.partial = std::move(partial);
        hook_->save(state, SaveReason::preempted);
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
        auto eval = evaluate(model_, *eval_data_, options_.per_device_eval_batch_size, options_.dtype, options_.device,
                             options_.mixed_precision);
        eval.step = record.step;
        observer_.on_eval(eval);
      }
      if (hook_ != nullptr) {
        if (stop_agreed_ && !last_step) {
          hook_->save(state_at(pos), SaveReason::preempted);
          summary.preempted = true;
          break;
        }
        if (last_step) {
          hook_->save(state_at(pos), SaveReason::final);
        } else if (options_.save_steps > 0 && record.step % options_.save_steps == 0) {
          hook_->save(state_at(pos), SaveReason::periodic);
        }
      }
    }
  }
  summary.steps = steps_->step();
  summary.samples = pos.samples;
  summary.items = pos.items;
  summary.wall_s = seconds_since(start);
  summary.train_loss = summary.steps > 0 ? pos.loss_total / static_cast<double>(summary.steps) : 0.0;
  summary.samples_per_s = static_cast<double>(summary.samples) / summary.wall_s;
  summary.items_per_s = static_cast<double>(summary.items) / summary.wall_s;
  if (eval_data_ != nullptr && !summary.preempted) {
    summary.eval = evaluate(model_, *eval_data_, options_.per_device_eval_batch_size, options_.dtype, options_.device,
                            options_.mixed_precision);
    summary.eval.step = summary.steps;
    summary.has_eval = true;
    observer_.on_eval(summary.eval);
  }
  observer_.on_end(summary);
  return summary;
}

}  // namespace gradaccum::core
