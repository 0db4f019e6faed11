#include "gradaccum/cli/train_command.h"

#include <signal.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <filesystem>

#include "gradaccum/cli/launcher.h"
#include "gradaccum/cli/runtime.h"
#include "gradaccum/cli/plan_command.h"
#include "gradaccum/cli/plot_command.h"
#include "gradaccum/cli/progress.h"
#include "gradaccum/core/batch_dependence.h"
#include "gradaccum/core/check.h"
#include "gradaccum/core/custom_kernels.h"
#include "gradaccum/core/float32_cpu_matmuls.h"
#include "gradaccum/io/heap_retention.h"
#include "gradaccum/core/trainer.h"
#include "gradaccum/dist/bucketed_grad_sync.h"
#include "gradaccum/dist/tree_grad_sync.h"
#include "gradaccum/dist/environment.h"
#include "gradaccum/dist/process_group.h"
#include "gradaccum/dist/store_stop_agreement.h"
#include "gradaccum/dist/sharded_optimizer.h"
#include "gradaccum/io/checkpoint.h"
#include "gradaccum/io/grad_flow_writer.h"
#include "gradaccum/io/config.h"
#include "gradaccum/io/metrics_writer.h"
#include "gradaccum/io/process_stats.h"
#include "gradaccum/io/tensorboard_writer.h"
#include "gradaccum/cli/workload.h"
#include "gradaccum/models/generation.h"
#include "gradaccum/models/hf_checkpoint.h"

namespace gradaccum::cli {

namespace {

// SIGTERM / SIGINT ask the loop to stop and save (preemption); a second one
// falls back to the default action, so a stuck run can still be interrupted.
std::atomic<bool> g_stop_requested{false};

extern "C" void request_stop(int signal_number) {
  if (g_stop_requested.exchange(true)) {
    ::signal(signal_number, SIG_DFL);
    ::raise(signal_number);
  }
}

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = request_stop;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

// Saves what the loop hands over plus what this program owns: the weights, the
// optimizer and the configuration.
class CheckpointWriter final : public core::CheckpointHook {
 public:
  CheckpointWriter(io::CheckpointStore& store, models::BuiltModel& model, bool rank0,
                   bool optimizer_per_rank, std::string resolved_config, uint64_t seed)
      : store_(store),
        model_(model),
        rank0_(rank0),
        optimizer_per_rank_(optimizer_per_rank),
        resolved_config_(std::move(resolved_config)),
        seed_(seed) {}

  void set_optimizer(torch::optim::Optimizer& optimizer, optim::NamedParameters parameters) {
    optimizer_ = &optimizer;
    parameters_ = std::move(parameters);
  }

  void save(const core::TrainingState& state, core::SaveReason /*reason*/) override {
    io::CheckpointContents contents;
    contents.state = state;
    if (rank0_) {
      contents.model = model_.weights();
      contents.model_config = model_.hf_config;
    }
    if (rank0_ || optimizer_per_rank_) {
      contents.optimizer = dist::named_optimizer_state(*optimizer_, parameters_);
    }
    contents.optimizer_per_rank = optimizer_per_rank_;
    contents.resolved_config = resolved_config_;
    contents.seed = seed_;
    last_ = store_.save(contents);
  }

  const std::string& last() const { return last_; }

 private:
  io::CheckpointStore& store_;
  models::BuiltModel& model_;
  bool rank0_;
  bool optimizer_per_rank_;
  std::string resolved_config_;
  uint64_t seed_;
  torch::optim::Optimizer* optimizer_ = nullptr;
  optim::NamedParameters parameters_;
  std::string last_;
};

// Checks a checkpoint against this run and adapts its position when the user
// allowed a different global batch.
core::TrainingState resume_state(const io::LoadedCheckpoint& loaded, const io::TrainConfig& config,
                                 const core::BatchGeometry& geometry) {
  auto state = loaded.state;
  GA_CHECK(loaded.seed == config.trainer.seed,
           "checkpoint {}: it was saved with seed {} and this run has seed {}; the data order would "
           "change",
           loaded.directory, loaded.seed, config.trainer.seed);
  GA_CHECK(state.window_tokens == config.trainer.window_tokens,
           "checkpoint {}: it was saved with window_tokens {} and this run has {}; that changes the windows",
           loaded.directory, state.window_tokens, config.trainer.window_tokens);
  // Token windows do not depend on b, N or W: any decomposition continues them between windows.
  if (state.window_tokens > 0) {
    state.global_batch = geometry.global_batch();
  } else if (state.global_batch != geometry.global_batch()) {
    GA_CHECK(config.allow_batch_change,
             "checkpoint {}: it was saved with global batch {} and this run has {}; that changes the "
             "trajectory (set allow_batch_change=true to continue anyway)",
             loaded.directory, state.global_batch, geometry.global_batch());
    GA_CHECK(state.position.micro_step == 0,
             "checkpoint {}: saved inside a window, it cannot continue with another global batch",
             loaded.directory);
    // Continue at the window holding the first sample not yet seen.
    state.position.window = state.position.window * state.global_batch / geometry.global_batch();
    state.global_batch = geometry.global_batch();
  }
  return state;
}

// The trained model on its own, for `generate`, `eval` and other programs: an
// HF checkpoint (with the tokenizer's files) for language models, the weights
// alone for the image networks.
void save_final_model(Workload& workload, const std::string& dir) {
  auto& model = workload.model;
  if (!model.is_language_model()) {
    std::filesystem::create_directories(dir);
    io::save_safetensors(dir + "/model.safetensors", model.weights());
    return;
  }
  models::write_hf_checkpoint(dir, {model.hf_config, model.weights()});
  if (workload.tokenizer) {
    // gpt2.tiktoken, tokenizer.json, or encoder.json + vocab.bpe: whatever it was loaded from.
    for (const auto& file : tokenizer_files(*workload.tokenizer)) {
      std::filesystem::copy_file(file, std::filesystem::path(dir) / std::filesystem::path(file).filename(),
                                 std::filesystem::copy_options::overwrite_existing);
    }
  }
}

void print_sample(Workload& workload, const io::SampleConfig& sample) {
  const auto& tokenizer = *workload.tokenizer;
  const auto prompt = tokenizer.encode(sample.prompt);
  if (prompt.empty()) return;
  models::GenerationOptions options;
  options.max_new_tokens = sample.max_new_tokens;
  options.temperature = sample.temperature;
  options.top_k = sample.top_k;
  options.max_positions = workload.model.max_positions;
  const auto eot = tokenizer.token_id("<|endoftext|>");
  if (eot) options.stop_token = *eot;
  const auto ids = models::generate(*workload.model.causal_lm(),
                                    std::vector<int64_t>(prompt.begin(), prompt.end()), options);
  std::vector<data::TokenId> tokens(ids.begin(), ids.end());
  if (!tokens.empty() && eot && tokens.back() == *eot) tokens.pop_back();
  fmt::print("sample: {}{}\n", sample.prompt, tokenizer.decode(tokens));
}

// Peak RSS as of the latest optimizer step, i.e. before the end-of-run
// checkpoint and final save (rank 0's metrics lines carry the same figure).
class StepPeakRss final : public core::TrainingObserver {
 public:
  void on_step(const core::StepRecord&) override { mb_ = io::peak_rss_mb(); }
  double mb() const { return mb_; }

 private:
  double mb_ = 0.0;
};

}  // namespace

int run_train(const TrainArgs& args) {
  GA_CHECK(args.nproc >= 1, "--nproc must be >= 1, got {}", args.nproc);
  const auto env = dist::read_environment();
  const int64_t world = args.nproc > 1 ? args.nproc : env.world_size;
  // Validated once here, so bad input gives one message, not one per rank.
  auto config = io::load_config(args.config_path, args.overrides, world);
  if (args.print_config) {
    fmt::print("{}", config.resolved_yaml);
    return 0;
  }
  auto child_args = args.child_args;
  if (config.plan_decomposition) {
    // `auto`: probe one process's share of the global batch and go on with the plan's choice.
    GA_CHECK(!env.distributed(),
             "key 'per_device_train_batch_size': auto is planned before the ranks start; launch with --nproc, or run "
             "`gradaccum plan` and set the numbers");
    const int64_t global = config.trainer.global_batch_size;
    GA_CHECK(global % world == 0, "key 'global_batch_size': {} is not a multiple of the world size {}", global, world);
    PlanArgs plan_args;
    plan_args.config_path = args.config_path;
    plan_args.overrides = args.overrides;
    plan_args.global_batch = global / world;
    const auto plan = make_plan(plan_args);
    GA_CHECK(plan.choice.has_value(),
             "per_device_train_batch_size: auto: no micro-batch of {} samples per process fits in {:.0f} MB (the "
             "global batch is not changed)",
             plan_args.global_batch, plan.limit_mb);
    const std::vector<std::string> chosen{fmt::format("per_device_train_batch_size={}", plan.choice->micro_batch),
                                          fmt::format("gradient_accumulation_steps={}", plan.choice->accumulation)};
    auto overrides = args.overrides;
    for (const auto& o : chosen) {
      overrides.push_back(o);
      child_args.insert(child_args.end(), {"--set", o});
    }
    config = io::load_config(args.config_path, overrides, world);
    fmt::print("auto: per_device_train_batch_size={} gradient_accumulation_steps={} (planned; global batch {})\n",
               plan.choice->micro_batch, plan.choice->accumulation, global);
  }
  if (args.nproc > 1) {
    GA_CHECK(!env.distributed(), "--nproc {} inside a launched job (WORLD_SIZE={}): use one launcher",
             args.nproc, env.world_size);
    return launch_local(args.nproc, child_args);
  }
  const bool rank0 = env.rank == 0;

  const int threads = configure_threads(config.threads, env.local_world_size);
  core::set_custom_kernels(config.custom_kernels);
  // Keep the memory a step frees for the next step instead of re-faulting it (heap_retention.h).
  if (core::custom_kernel_enabled(core::CustomKernel::heap_retention)) io::retain_freed_heap();
  if (core::routes_cpu_matmuls_through_float32(config.bf16_cpu_matmuls, config.trainer.mixed_precision,
                                               config.trainer.device, core::cpu_has_native_bf16(),
                                               core::cpu_has_native_fp16())) {
    core::route_cpu_autocast_matmuls_through_float32();
    if (rank0 && config.trainer.mixed_precision == core::MixedPrecision::bf16) {
      fmt::print(stderr, "bf16 matmuls: float32 GEMMs on bfloat16-rounded operands "
                         "(bf16_cpu_matmuls: {})\n", config.bf16_cpu_matmuls);
    } else if (rank0) {
      fmt::print(stderr, "fp16 matmuls: float32 GEMMs on float16-rounded operands "
                         "(this CPU has no AVX512-FP16)\n");
    }
  }
  GA_CHECK(!config.trainer.device.is_cuda() || torch::cuda::is_available(),
           "key 'device': cuda requested but this libtorch has no CUDA device");

  // Everything that can fail on bad input happens before output_dir is created.
  std::optional<io::LoadedCheckpoint> checkpoint;
  if (!config.resume_from_checkpoint.empty()) {
    checkpoint = io::read_checkpoint(
        io::resolve_checkpoint(config.resume_from_checkpoint, config.output_dir), env.rank);
  }
  torch::manual_seed(config.trainer.seed);
  auto workload = make_workload(config, /*with_eval=*/rank0);  // rank 0 evaluates and reports
  auto& built = workload.model;
  auto* model = built.task.get();
  const auto geometry = config.trainer.geometry(world);
  if (const auto warning = core::batch_dependence_warning(
          model->module(), geometry.accumulation_steps(), geometry.world_size());
      !warning.empty() && rank0) {
    fmt::print(stderr, "{}\n", warning);
  }

  std::optional<core::TrainingState> resumed;
  if (checkpoint) resumed = resume_state(*checkpoint, config, geometry);

  // Data parallel: connect, refuse mismatched configurations, and hook the
  // reducer onto the parameters in their final device and dtype.
  std::unique_ptr<core::GradSync> sync;
  std::unique_ptr<torch::optim::Optimizer> sharded;
  c10::intrusive_ptr<c10d::Backend> group;
  std::unique_ptr<dist::StoreStopAgreement> stop_agreement;
  if (env.distributed()) {
    auto connection = dist::connect(env, std::chrono::seconds(config.dist_timeout_s), config.trainer.device);
    group = connection.group;
    stop_agreement = std::make_unique<dist::StoreStopAgreement>(connection.store, env.rank);
    dist::check_same_on_all_ranks(*group, static_cast<int64_t>(std::hash<std::string>{}(config.resolved_yaml) >> 1),
                                  "configuration");
    model->module().to(config.trainer.device, config.trainer.dtype);
    std::vector<torch::Tensor> params;
    for (auto& p : model->module().parameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    if (config.trainer.deterministic_accumulation) {
      sync = std::make_unique<dist::TreeGradSync>(group, params);  // the canonical tree's top levels
    } else {
      dist::GradSyncOptions options;
      options.bucket_bytes = config.ddp_bucket_cap_mb * 1024 * 1024;
      options.sync_each_micro_step = config.sync_each_micro_step;
      sync = std::make_unique<dist::BucketedGradSync>(group, params, options);
    }
    if (config.zero_stage == 1) {
      sharded = std::make_unique<dist::ShardedOptimizer>(group, params, config.trainer.optimizer);
    }
  }

  // Rank 0 writes the outputs; every figure it reports is global.
  core::ObserverList observers;
  StepPeakRss step_peak;
  observers.add(step_peak);
  std::unique_ptr<io::MetricsWriter> metrics;
  std::unique_ptr<Progress> progress;
  std::unique_ptr<io::TensorBoardWriter> tensorboard;
  std::unique_ptr<io::GradFlowWriter> grad_flow;
  if (rank0) {
    std::filesystem::create_directories(config.output_dir);
    io::write_file_atomically((std::filesystem::path(config.output_dir) / "config.yaml").string(),
                              config.resolved_yaml);
    metrics = std::make_unique<io::MetricsWriter>(config.output_dir, workload.items_are_tokens,
                                                  resumed ? resumed->position.step : -1);
    progress = std::make_unique<Progress>(stdout, isatty(STDOUT_FILENO) != 0, config.logging_steps);
    observers.add(*metrics);
    observers.add(*progress);
    if (config.trainer.grad_flow_steps > 0) {
      grad_flow = std::make_unique<io::GradFlowWriter>(config.output_dir, resumed ? resumed->position.step : -1);
      observers.add(*grad_flow);
    }
    if (std::find(config.report_to.begin(), config.report_to.end(), "tensorboard") != config.report_to.end()) {
      tensorboard = std::make_unique<io::TensorBoardWriter>(config.logging_dir, workload.items_are_tokens,
                                                            config.logging_steps);
      observers.add(*tensorboard);
    }
    fmt::print("threads: {}, dtype: {}, device: {}, world size: {}, output: {}\n", threads,
               config.dtype, config.device, world, config.output_dir);
    fmt::print("libtorch: {}\nkernels: {}; custom: {}\n", libtorch_description(), kernels_description(),
               core::custom_kernels_description());
    if (!workload.description.empty()) fmt::print("data: {}\n", workload.description);
  }
  const bool optimizer_per_rank = sharded != nullptr;
  core::Trainer trainer(config.trainer, *model, *workload.train, workload.eval.get(), observers,
                        sync.get(), std::move(sharded));
  if (checkpoint) {
    const auto& dir = checkpoint->directory;
    built.load_weights(checkpoint->model, dir + "/model.safetensors");
    dist::load_named_optimizer_state(trainer.optimizer(), trainer.named_parameters(),
                                     checkpoint->optimizer, dir);
    if (checkpoint->rng_state.defined()) {
      auto generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(checkpoint->rng_state);
    }
    trainer.restore(*resumed);
    if (rank0) {
      fmt::print("resuming from {} at step {} (epoch {}, window {}, micro-step {})\n", dir,
                 resumed->position.step, resumed->position.epoch, resumed->position.window,
                 resumed->position.micro_step);
    }
  }

  io::CheckpointStoreOptions store_options;
  store_options.output_dir = config.output_dir;
  store_options.rank = env.rank;
  store_options.world_size = world;
  store_options.save_total_limit = config.save_total_limit;
  if (group) store_options.barrier = [&group] { dist::barrier(*group, "the checkpoint barrier"); };
  io::CheckpointStore store(store_options);
  CheckpointWriter writer(store, built, rank0, optimizer_per_rank, config.resolved_yaml,
                          config.trainer.seed);
  writer.set_optimizer(trainer.optimizer(), trainer.named_parameters());
  install_stop_handlers();
  trainer.set_checkpointing(&writer, &g_stop_requested, stop_agreement.get());

  const auto summary = trainer.run();
  if (summary.preempted) {
    if (rank0) {
      fmt::print("stopped at step {} on request; checkpoint: {}\nresume with: --set "
                 "resume_from_checkpoint=latest\n",
                 summary.steps, writer.last());
    }
  } else if (rank0) {
    save_final_model(workload, (std::filesystem::path(config.output_dir) / "final").string());
    if (workload.tokenizer && built.causal_lm() != nullptr && !config.sample.prompt.empty()) {
      print_sample(workload, config.sample);
    }
  }
  if (rank0 && args.plots) write_plots_and_report(config.output_dir);
  if (!rank0) {
    // Memory is per process: every rank leaves its own figures beside the
    // summary, for the whole run and for the training loop alone.
    const nlohmann::json figures = {{"rank", env.rank},
                                    {"peak_rss_mb", io::peak_rss_mb()},
                                    {"train_peak_rss_mb", step_peak.mb()}};
    io::write_file_atomically(
        (std::filesystem::path(config.output_dir) / fmt::format("rank{}.json", env.rank)).string(),
        figures.dump() + "\n");
  }
  if (group) {
    // Every rank is done with its outputs; then the group is shut down, not just dropped
    // (libtorch's NCCL backend warns and may leak communicators otherwise).
    dist::barrier(*group, "the end of the run");
    group->shutdown();
  }
  return 0;
}

}  // namespace gradaccum::cli
