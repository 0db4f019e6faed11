#include "gradaccum/run/fit.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <mutex>
#include <optional>

#include "gradaccum/base/check.h"
#include "gradaccum/base/files.h"
#include "gradaccum/core/batch_dependence.h"
#include "gradaccum/core/evaluator.h"
#include "gradaccum/core/saved_geometry.h"
#include "gradaccum/dist/bucketed_grad_sync.h"
#include "gradaccum/dist/environment.h"
#include "gradaccum/dist/optimizer_reshard.h"
#include "gradaccum/dist/process_group.h"
#include "gradaccum/dist/sharded_grad_sync.h"
#include "gradaccum/dist/sharded_optimizer.h"
#include "gradaccum/dist/sharded_parameters.h"
#include "gradaccum/dist/store_stop_agreement.h"
#include "gradaccum/dist/tree_grad_sync.h"
#include "gradaccum/dist/unit_shard_optimizer.h"
#include "gradaccum/formats/safetensors.h"
#include "gradaccum/io/checkpoint.h"
#include "gradaccum/io/grad_flow_writer.h"
#include "gradaccum/io/metrics_writer.h"
#include "gradaccum/io/process_stats.h"
#include "gradaccum/io/tensorboard_writer.h"
#include "gradaccum/kernels/custom_kernels.h"
#include "gradaccum/models/built_model.h"
#include "gradaccum/models/hf_checkpoint.h"
#include "gradaccum/models/lora.h"
#include "gradaccum/models/module_tensors.h"
#include "gradaccum/run/checkpoint_writer.h"
#include "gradaccum/run/profiler_trace.h"
#include "gradaccum/run/progress.h"
#include "gradaccum/run/runtime.h"
#include "gradaccum/run/stop_signals.h"

namespace gradaccum::run {

namespace fs = std::filesystem;

ModelFiles model_files(models::BuiltModel& model) {
  ModelFiles files;
  files.weights = [&model] { return model.weights(); };
  files.load = [&model](const models::WeightList& weights, const std::string& what) {
    model.load_weights(weights, what);
  };
  files.config = model.hf_config;
  if (model.lora) {
    files.config = models::peft_adapter_config(*model.lora);
    files.weights_file = "adapter_model.safetensors";
    files.config_file = "adapter_config.json";
  }
  return files;
}

namespace {

// The default names: the module's own.
ModelFiles complete(const ModelFiles& given, core::Trainable& model) {
  ModelFiles files = given;
  if (!files.weights) files.weights = [&model] { return models::module_tensors(model.module()); };
  if (!files.load) {
    files.load = [&model](const models::WeightList& weights, const std::string& what) {
      models::load_module_tensors(model.module(), weights, what);
    };
  }
  return files;
}

// Checks a checkpoint against this run and adapts its position when a different global batch
// is allowed.
core::TrainingState resume_state(const io::LoadedCheckpoint& loaded, const RunOptions& options,
                                 const core::BatchGeometry& geometry) {
  auto state = loaded.state;
  GA_CHECK(loaded.seed == options.trainer.seed,
           "checkpoint {}: it was saved with seed {} and this run has seed {}; the data order would "
           "change",
           loaded.directory, loaded.seed, options.trainer.seed);
  const auto saved = core::SavedGeometry::restore(state);
  saved.check_position_is_possible(state);
  GA_CHECK(saved.window_tokens == options.trainer.window_tokens,
           "checkpoint {}: it was saved with window_tokens {} and this run has {}; that changes the windows",
           loaded.directory, saved.window_tokens, options.trainer.window_tokens);
  // Token windows do not depend on b, N or W: any decomposition continues them between windows.
  const int64_t saved_batch = saved.geometry.global_batch();
  if (saved.window_tokens == 0 && saved_batch != geometry.global_batch()) {
    GA_CHECK(options.allow_batch_change,
             "checkpoint {}: it was saved with global batch {} and this run has {}; that changes the "
             "trajectory (set allow_batch_change=true to continue anyway)",
             loaded.directory, saved_batch, geometry.global_batch());
    GA_CHECK(state.position.micro_step == 0,
             "checkpoint {}: saved inside a window, it cannot continue with another global batch", loaded.directory);
    // Continue at the window holding the first sample not yet seen: a position of this run's
    // windows from then on.
    int64_t seen = 0;
    GA_CHECK(!__builtin_mul_overflow(state.position.window, saved_batch, &seen),
             "checkpoint {}: window {} of global batch {} is beyond any dataset", loaded.directory,
             state.position.window, saved_batch);
    state.position.window = seen / geometry.global_batch();
    core::SavedGeometry{geometry, saved.window_tokens}.save(state);
  }
  return state;
}

// Peak RSS as of the latest optimizer step, i.e. before the end-of-run checkpoint and final save
// (rank 0's metrics lines carry the same figure).
class StepPeakRss final : public core::TrainingObserver {
 public:
  void on_step(const core::StepRecord&) override { mb_ = io::peak_rss_mb(); }
  double mb() const { return mb_; }

 private:
  double mb_ = 0.0;
};

// 1. The process set-up's one line about CPU autocast's route, and the device there is.
void check_process(const RunOptions& options, const ProcessSetup& process, bool rank0) {
  const auto& t = options.trainer;
  if (process.settings().cpu_matmuls_through_float32 && rank0) {
    if (t.mixed_precision == core::MixedPrecision::bf16) {
      fmt::print(stderr, "bf16 matmuls: float32 GEMMs on bfloat16-rounded operands (bf16_cpu_matmuls: {})\n",
                 core::to_string(options.bf16_cpu_matmuls));
    } else {
      fmt::print(stderr, "fp16 matmuls: float32 GEMMs on float16-rounded operands (this CPU has no AVX512-FP16)\n");
    }
  }
  GA_CHECK(!t.device.is_cuda() || torch::cuda::is_available(),
           "key 'device': cuda requested but this libtorch has no CUDA device");
}

// 2. Data parallel: connect, refuse mismatched configurations, and hook the reducer onto the
// parameters in their final device and dtype.
struct DataParallel {
  c10::intrusive_ptr<c10d::Backend> group;
  std::unique_ptr<core::GradSync> sync;
  std::unique_ptr<torch::optim::Optimizer> sharded;
  std::unique_ptr<dist::StoreStopAgreement> stop_agreement;
  dist::ShardedParameters* zero3 = nullptr;  // sync, under zero_stage 3
  // The model's unit scope is zero3 while it lives (declared last: uninstalled first).
  std::unique_ptr<core::Trainable, void (*)(core::Trainable*)> scope_installed{
      nullptr, [](core::Trainable* model) { model->set_unit_scope(nullptr); }};
};

// ZeRO-2's and ZeRO-3's reducer options, the policy chosen here when it is auto (on the least
// memory any rank has, so that every rank chooses the same).
dist::ShardedGradSyncOptions sharded_sync_options(const RunOptions& options, const dist::DistEnvironment& env,
                                                  const c10::intrusive_ptr<c10d::Backend>& group,
                                                  const std::vector<torch::Tensor>& params) {
  const auto& t = options.trainer;
  GA_CHECK(t.grad_flow_steps == 0,
           "key 'grad_flow_steps': zero_stage: {} keeps each rank's shard of the gradients, not each parameter's "
           "whole gradient; set grad_flow_steps=0",
           options.zero_stage);
  dist::ShardedGradSyncOptions sync_options;
  sync_options.bucket_bytes = options.ddp_bucket_cap_mb * 1024 * 1024;
  sync_options.policy = options.sharded_grad_sync;
  if (sync_options.policy == dist::GradShardPolicy::automatic && options.zero_stage == 3) {
    // ZeRO-3 chooses per unit, on the same memory.
    sync_options.available_bytes = dist::min_over_ranks(*group, io::available_memory_bytes(t.device));
  } else if (sync_options.policy == dist::GradShardPolicy::automatic) {
    int64_t elements = 0;
    for (const auto& p : params) elements += p.numel();
    const int64_t element_bytes = static_cast<int64_t>(params.front().element_size());
    const int64_t shard = (elements + env.world_size - 1) / env.world_size;
    const int64_t available = dist::min_over_ranks(*group, io::available_memory_bytes(t.device));
    const auto choice = dist::choose_grad_shard_policy(elements * element_bytes, shard * element_bytes, available);
    sync_options.policy = choice.policy;
    if (env.rank == 0 && options.console) fmt::print(stderr, "sharded_grad_sync auto: {}\n", choice.reason);
  }
  return sync_options;
}

// The optimizer files a run saves: one shard per rank under ZeRO-1/2 (W), or one whole state (0).
// connect() shards exactly then (deterministic_accumulation, which does not, needs zero_stage 0).
int64_t optimizer_shards(const RunOptions& options, const dist::DistEnvironment& env) {
  return env.distributed() && options.zero_stage > 0 ? env.world_size : 0;
}

DataParallel connect(const RunOptions& options, const dist::DistEnvironment& env, core::Trainable& model) {
  DataParallel dp;
  if (!env.distributed()) return dp;
  const auto& t = options.trainer;
  auto connection = dist::connect(env, std::chrono::seconds(options.dist_timeout_s), t.device);
  dp.group = connection.group;
  dp.stop_agreement = std::make_unique<dist::StoreStopAgreement>(connection.store, env.rank);
  dist::check_same_on_all_ranks(*dp.group, static_cast<int64_t>(std::hash<std::string>{}(options.description) >> 1),
                                "configuration");
  core::place_module(model.module(), t.device, t.dtype);
  std::vector<torch::Tensor> params;
  for (auto& p : model.module().parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  if (t.deterministic_accumulation) {
    dp.sync = std::make_unique<dist::TreeGradSync>(dp.group, params);  // the canonical tree's top levels
  } else if (options.zero_stage == 3) {
    auto zero3 = std::make_unique<dist::ShardedParameters>(dp.group, params, model.units(),
                                                           sharded_sync_options(options, env, dp.group, params));
    dp.zero3 = zero3.get();
    if (env.rank == 0 && options.console && !zero3->policy_reason().empty()) {
      fmt::print(stderr, "sharded_grad_sync auto: {}\n", zero3->policy_reason());
    }
    dp.sharded = std::make_unique<dist::UnitShardOptimizer>(*zero3, t.optimizer);
    dp.sync = std::move(zero3);
    model.set_unit_scope(dp.zero3);
    dp.scope_installed.reset(&model);
    return dp;
  } else if (options.zero_stage == 2) {
    dp.sync =
        std::make_unique<dist::ShardedGradSync>(dp.group, params, sharded_sync_options(options, env, dp.group, params));
    auto sharded = std::make_unique<dist::ShardedOptimizer>(dp.group, params, t.optimizer);
    sharded->take_gradients_from(static_cast<const dist::ShardedGradSync&>(*dp.sync));
    dp.sharded = std::move(sharded);
    return dp;
  } else {
    dist::GradSyncOptions sync_options;
    sync_options.bucket_bytes = options.ddp_bucket_cap_mb * 1024 * 1024;
    sync_options.sync_each_micro_step = options.sync_each_micro_step;
    dp.sync = std::make_unique<dist::BucketedGradSync>(dp.group, params, sync_options);
  }
  if (options.zero_stage == 1) dp.sharded = std::make_unique<dist::ShardedOptimizer>(dp.group, params, t.optimizer);
  return dp;
}

// 3. Refuses, before anything is written, a directory that cannot be made: one that exists as
// something else, or whose nearest existing ancestor is not a writable directory.
void check_directory_can_be_made(const std::string& dir, const std::string& key) {
  std::error_code ec;
  const fs::path target = fs::absolute(dir, ec);
  fs::path existing = target;
  while (!fs::exists(existing, ec) && existing.has_relative_path()) existing = existing.parent_path();
  if (existing == target) {
    GA_CHECK(fs::is_directory(target, ec), "key '{}': {} exists and is not a directory", key, dir);
  } else {
    GA_CHECK(fs::is_directory(existing, ec), "key '{}': cannot create {}: {} is not a directory", key, dir,
             existing.string());
  }
  GA_CHECK(::access(existing.c_str(), W_OK | X_OK) == 0, "key '{}': cannot create or write {}: {}: {}", key, dir,
           existing.string(), std::strerror(errno));
}

// A fresh run must not mix its checkpoints with an earlier run's: `latest` and save_total_limit
// would then pick among both.
void check_fresh_output_dir(const RunOptions& options, const std::string& resume_dir) {
  if (!resume_dir.empty() || options.overwrite_output_dir) return;
  const auto newest = io::newest_checkpoint_directory(options.output_dir);
  GA_CHECK(newest.empty(),
           "output_dir {}: it holds checkpoints of an earlier run ({}); continue that run with "
           "resume_from_checkpoint=latest, or set overwrite_output_dir=true to start a new one there",
           options.output_dir, newest);
}

std::string logging_dir_of(const RunOptions& options) {
  return options.logging_dir.empty() ? (fs::path(options.output_dir) / "runs").string() : options.logging_dir;
}

// What a save cut short by a crash left in output_dir: atomic writes' temporaries (.tmp-<pid>-<file>,
// <file>.tmp of earlier versions), the final model's staging and swapped-out directories, and
// partial files inside final/. Nothing else of a run is named so. (checkpoints/ has its own:
// io::CheckpointStore removes them.)
void remove_stale_temporaries(const std::string& output_dir) {
  std::error_code ec;
  const auto stale = [](const std::string& name) {
    const auto ends_with = [&](const char* tail) {
      const std::string t = tail;
      return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
    };
    return name.rfind(".tmp-", 0) == 0 || name.rfind("final.tmp-", 0) == 0 || name.rfind("final.old-", 0) == 0 ||
           ends_with(".yaml.tmp") || ends_with(".json.tmp") || ends_with(".jsonl.tmp");
  };
  for (const auto& dir : {fs::path(output_dir), fs::path(output_dir) / "final"}) {
    if (!fs::is_directory(dir, ec)) continue;
    std::vector<fs::path> doomed;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (stale(entry.path().filename().string())) doomed.push_back(entry.path());
    }
    for (const auto& path : doomed) fs::remove_all(path, ec);
  }
}

// 4. Rank 0's outputs, every figure global.
struct Outputs {
  std::unique_ptr<io::MetricsWriter> metrics;
  std::unique_ptr<Progress> progress;
  std::unique_ptr<io::TensorBoardWriter> tensorboard;
  std::unique_ptr<io::GradFlowWriter> grad_flow;
};

Outputs open_outputs(const RunOptions& options, int64_t resumed_step, const std::string& run_id,
                     core::ObserverList& observers) {
  Outputs out;
  fs::create_directories(options.output_dir);
  remove_stale_temporaries(options.output_dir);
  io::write_run_id(options.output_dir, run_id);
  if (!options.description.empty()) {
    base::write_file_atomically((fs::path(options.output_dir) / "config.yaml").string(), options.description);
  }
  out.metrics = std::make_unique<io::MetricsWriter>(options.output_dir, options.items_are_tokens, resumed_step);
  observers.add(*out.metrics);
  if (options.console) {
    out.progress = std::make_unique<Progress>(stdout, isatty(STDOUT_FILENO) != 0, options.logging_steps,
                                              options.test_data != nullptr ? "validation" : "test");
    observers.add(*out.progress);
  }
  if (options.trainer.grad_flow_steps > 0) {
    out.grad_flow = std::make_unique<io::GradFlowWriter>(options.output_dir, resumed_step);
    observers.add(*out.grad_flow);
  }
  if (options.reports_to("tensorboard")) {
    out.tensorboard = std::make_unique<io::TensorBoardWriter>(logging_dir_of(options), options.items_are_tokens,
                                                              options.logging_steps);
    observers.add(*out.tensorboard);
  }
  return out;
}

// 6. The trained model on its own: an HF checkpoint when the model has a config.json, else the
// weights alone; `extra_files` copied beside them. Written into output_dir/.tmp-final-<pid>, each
// file fsynced, and published as final/ in one rename: a crash leaves the previous final/ or the
// new one, and a temporary that the next run's start removes.
void save_final(const ModelFiles& files, const std::vector<std::string>& extra_files, const fs::path& final_dir) {
  const fs::path staging =
      final_dir.parent_path() / (".tmp-" + final_dir.filename().string() + "-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(staging, ec);
  GA_CHECK(fs::create_directories(staging, ec), "{}: cannot create {}: {}", final_dir.string(), staging.string(),
           ec.message());
  try {
    if (!files.config.is_null()) {
      base::write_file_atomically((staging / files.config_file).string(), files.config.dump(2) + "\n");
    }
    formats::save_safetensors((staging / files.weights_file).string(), files.weights());
    for (const auto& file : extra_files) {
      base::copy_file_atomically(file, (staging / fs::path(file).filename()).string());
    }
    base::fsync_directory(staging.string());
    base::replace_directory(staging.string(), final_dir.string());
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
}

}  // namespace

RunResult fit(const RunOptions& options, core::Trainable& model, const core::Dataset& train_data,
              const core::Dataset* eval_data, const ModelFiles& given_files, core::TrainingObserver* observer,
              const ProcessSetup* process, const dist::DistEnvironment& env) {
  const bool rank0 = env.rank == 0;
  const auto files = complete(given_files, model);
  // Given none, the run's own, for this call: the process is as before when fit returns.
  std::optional<ProcessSetup> own_process;
  if (process == nullptr) {
    process = &own_process.emplace(training_process_settings(options, options.trainer, env.local_world_size));
  }
  check_process(options, *process, rank0);
  const int threads = process->threads();

  // 3. Everything that can fail on bad input happens before anything is written.
  check_directory_can_be_made(options.output_dir, "output_dir");
  if (options.reports_to("tensorboard")) check_directory_can_be_made(logging_dir_of(options), "logging_dir");
  io::CheckpointChoice choice;
  if (!options.resume_from_checkpoint.empty()) {
    choice = io::choose_checkpoint(options.resume_from_checkpoint, options.output_dir);
    if (rank0) {
      for (const auto& note : choice.notes) fmt::print(stderr, "{}\n", note);
    }
  }
  check_fresh_output_dir(options, choice.directory);
  std::optional<io::LoadedCheckpoint> checkpoint;
  if (!choice.directory.empty()) {
    // ZeRO-3 cuts the optimizer state per unit, never as ZeRO-1/2 do: it always joins and cuts.
    const bool zero3 = env.distributed() && options.zero_stage == 3;
    checkpoint = io::read_checkpoint(choice.directory, env.rank,
                                     zero3 ? io::kOtherOptimizerLayout : optimizer_shards(options, env));
  }
  const auto geometry = options.trainer.geometry(env.world_size);
  if (const auto warning =
          core::batch_dependence_warning(model.module(), geometry.accumulation_steps(), geometry.world_size());
      !warning.empty() && rank0) {
    fmt::print(stderr, "{}\n", warning);
  }
  std::optional<core::TrainingState> resumed;
  if (checkpoint) resumed = resume_state(*checkpoint, options, geometry);
  // A resumed run continues the run of its checkpoint (one saved before run ids existed starts one).
  const std::string run_id = checkpoint && !checkpoint->run_id.empty() ? checkpoint->run_id : io::new_run_id();

  if (options.zero_stage > 0 && !env.distributed() && rank0 && options.console) {
    fmt::print(stderr, "zero_stage {} with one process: nothing to shard across ranks; it runs as zero_stage 0\n",
               options.zero_stage);
  }
  auto dp = connect(options, env, model);
  if (dp.group) {
    // Each rank chose on its own (latest, auto): they must continue the same step, or all start afresh.
    dist::check_same_on_all_ranks(*dp.group, checkpoint ? checkpoint->state.position.step : -1,
                                  "checkpoint to resume from (its step; -1: a fresh start)");
  }
  if (dp.zero3 != nullptr) {
    dist::check_same_on_all_ranks(*dp.group, eval_data != nullptr ? 1 : 0,
                                  "whether eval data is given (under zero_stage 3 every rank passes it)");
  }

  core::ObserverList observers;
  StepPeakRss step_peak;
  observers.add(step_peak);
  if (observer != nullptr) observers.add(*observer);

  // The checkpoint goes into the model and the optimizer before any output exists: a checkpoint
  // of another model or optimizer is refused with output_dir untouched.
  const bool optimizer_per_rank = dp.sharded != nullptr;
  GA_CHECK(optimizer_per_rank == (optimizer_shards(options, env) > 0), "the optimizer's layout is not the one read");
  core::Trainer trainer(options.trainer, model, train_data, eval_data, observers, dp.sync.get(), std::move(dp.sharded));
  if (checkpoint) {
    const auto& dir = checkpoint->directory;
    const auto load_weights = [&] { files.load(checkpoint->model, dir + "/" + checkpoint->model_file); };
    if (dp.sync) {
      dp.sync->with_whole_parameters(load_weights);
    } else {
      load_weights();
    }
    if (checkpoint->optimizer_parts.empty()) {
      dist::load_named_optimizer_state(trainer.optimizer(), trainer.named_parameters(), checkpoint->optimizer, dir);
    } else {
      dist::load_resharded_optimizer_state(trainer.optimizer(), trainer.named_parameters(), checkpoint->optimizer_parts,
                                           dir);
      if (rank0 && options.console && checkpoint->optimizer_shards != optimizer_shards(options, env)) {
        const auto layout = [](int64_t shards) {
          return shards == 0 ? std::string("whole") : fmt::format("in {} shards", shards);
        };
        fmt::print(stderr, "optimizer state: saved {}, resharded to this run's layout ({})\n",
                   layout(checkpoint->optimizer_shards), layout(optimizer_shards(options, env)));
      }
    }
    if (checkpoint->rng_state.defined()) {
      auto generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(checkpoint->rng_state);
    }
    trainer.restore(*resumed);
  }

  Outputs outputs;
  if (rank0) {
    outputs = open_outputs(options, resumed ? resumed->position.step : -1, run_id, observers);
    if (options.console) {
      fmt::print("threads: {}, dtype: {}, device: {}, world size: {}, output: {}\n", threads,
                 options.trainer.dtype == torch::kDouble ? "float64" : "float32", options.trainer.device.str(),
                 env.world_size, options.output_dir);
      fmt::print("libtorch: {}\nkernels: {}; custom: {}\n", libtorch_description(), kernels_description(),
                 kernels::custom_kernels_description());
      if (!options.data_description.empty()) fmt::print("data: {}\n", options.data_description);
      if (checkpoint) {
        fmt::print("resuming from {} at step {} (epoch {}, window {}, micro-step {})\n", checkpoint->directory,
                   resumed->position.step, resumed->position.epoch, resumed->position.window,
                   resumed->position.micro_step);
        const auto saved = core::SavedGeometry::restore(*resumed);
        if (resumed->position.micro_step > 0 && !saved.continues_inside_window(trainer.plan().geometry())) {
          const auto& g = saved.geometry;
          const auto& now = trainer.plan().geometry();
          fmt::print(
              "the window was saved at micro-step {} of {}x{}x{} (b x N x W) and this run is {}x{}x{}: it is "
              "trained again from its first micro-step\n",
              resumed->position.micro_step, g.micro_batch(), g.accumulation_steps(), g.world_size(), now.micro_batch(),
              now.accumulation_steps(), now.world_size());
        }
      }
    }
  }

  std::unique_ptr<ProfilerTrace> profiler_trace;
  if (options.profile_from_step > 0) {
    profiler_trace =
        std::make_unique<ProfilerTrace>(options.profile_from_step, options.profile_steps,
                                        fmt::format("{}/profiler/trace-rank{}.json", options.output_dir, env.rank),
                                        options.trainer.device.is_cuda(), resumed ? resumed->position.step : -1);
    observers.add(*profiler_trace);
    if (rank0 && options.console) {
      fmt::print("profiler: optimizer steps {} to {} traced to {}\n", options.profile_from_step,
                 profiler_trace->last_step(), profiler_trace->path());
    }
  }

  // 5. Checkpoints and preemption.
  io::CheckpointStoreOptions store_options;
  store_options.output_dir = options.output_dir;
  store_options.rank = env.rank;
  store_options.world_size = env.world_size;
  store_options.save_total_limit = options.save_total_limit;
  if (dp.group) {
    store_options.all_ok = [&dp](bool ok) {
      return dist::min_over_ranks(*dp.group, ok ? 1 : 0, "the checkpoint barrier") == 1;
    };
  }
  io::CheckpointStore store(store_options);
  CheckpointWriter writer(store, files, rank0, optimizer_per_rank, options.description, options.trainer.seed, run_id);
  writer.set_extra_files(options.final_files);
  writer.set_continue_after_failed_save(options.continue_after_failed_save);
  writer.set_optimizer(trainer.optimizer(), trainer.named_parameters());
  writer.set_parameter_source(dp.sync.get());
  const StopSignalsScope stop_signals;
  trainer.set_checkpointing(&writer, &stop_signals.requested(), dp.stop_agreement.get());

  RunResult result;
  result.rank = env.rank;
  result.world_size = env.world_size;
  result.summary = trainer.run();
  result.last_checkpoint = writer.last();
  if (dp.zero3 != nullptr) {
    // The model leaves training whole, as without sharding.
    dp.zero3->unshard();
    dp.scope_installed.reset();
  }
  // 7. Held out until now: the test split is evaluated once, by the model as trained. Every rank
  // evaluates it, as the Trainer's evaluations are run, so no rank waits at the end's barrier
  // (dist_timeout_s) while rank 0 alone works through it; rank 0 writes the figures.
  if (options.test_data != nullptr && !result.summary.preempted) {
    const auto& t = options.trainer;
    result.test =
        core::evaluate(model, *options.test_data, t.per_device_eval_batch_size, t.dtype, t.device, t.mixed_precision);
    result.test->step = result.summary.steps;
  }
  if (result.summary.preempted) {
    if (rank0 && options.console) {
      fmt::print("stopped at step {} on request; checkpoint: {}\nresume with: --set resume_from_checkpoint=latest\n",
                 result.summary.steps, writer.last());
    }
  } else if (rank0) {
    result.final_dir = (fs::path(options.output_dir) / "final").string();
    save_final(files, options.final_files, result.final_dir);
    if (result.test) {
      outputs.metrics->add_test(*result.test);
      if (options.console) {
        fmt::print(
            "test split: loss {:.4f}{} ({} samples, evaluated once)\n", result.test->loss,
            std::isnan(result.test->accuracy) ? "" : fmt::format(", accuracy {:.2f}%", 100.0 * result.test->accuracy),
            result.test->samples);
      }
    }
  }
  if (!rank0) {
    // Memory is per process: every rank leaves its own figures beside the summary, for the whole
    // run and for the training loop alone.
    const nlohmann::json figures = {
        {"rank", env.rank}, {"peak_rss_mb", io::peak_rss_mb()}, {"train_peak_rss_mb", step_peak.mb()}};
    base::write_file_atomically((fs::path(options.output_dir) / fmt::format("rank{}.json", env.rank)).string(),
                                figures.dump() + "\n");
  }
  if (dp.group) {
    // Every rank is done with its outputs; then the group is shut down, not just dropped
    // (libtorch's NCCL backend warns and may leak communicators otherwise).
    dist::barrier(*dp.group, "the end of the run");
    dp.group->shutdown();
  }
  return result;
}

}  // namespace gradaccum::run
