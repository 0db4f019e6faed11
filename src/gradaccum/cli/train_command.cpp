#include "gradaccum/cli/train_command.h"

#include <unistd.h>

#include <filesystem>

#include "gradaccum/cli/launcher.h"
#include "gradaccum/cli/runtime.h"
#include "gradaccum/cli/progress.h"
#include "gradaccum/core/batch_dependence.h"
#include "gradaccum/core/check.h"
#include "gradaccum/core/trainer.h"
#include "gradaccum/data/fashion_mnist.h"
#include "gradaccum/dist/bucketed_grad_sync.h"
#include "gradaccum/dist/environment.h"
#include "gradaccum/dist/process_group.h"
#include "gradaccum/dist/sharded_optimizer.h"
#include "gradaccum/io/process_stats.h"
#include "gradaccum/io/config.h"
#include "gradaccum/io/metrics_writer.h"
#include "gradaccum/models/model_factory.h"

namespace gradaccum::cli {

int run_train(const TrainArgs& args) {
  GA_CHECK(args.nproc >= 1, "--nproc must be >= 1, got {}", args.nproc);
  const auto env = dist::read_environment();
  const int64_t world = args.nproc > 1 ? args.nproc : env.world_size;
  // Validated once here, so bad input gives one message, not one per rank.
  const auto config = io::load_config(args.config_path, args.overrides, world);
  if (args.print_config) {
    fmt::print("{}", config.resolved_yaml);
    return 0;
  }
  if (args.nproc > 1) {
    GA_CHECK(!env.distributed(), "--nproc {} inside a launched job (WORLD_SIZE={}): use one launcher",
             args.nproc, env.world_size);
    return launch_local(args.nproc, args.child_args);
  }
  const bool rank0 = env.rank == 0;

  const int threads = configure_threads(config.threads, env.local_world_size);
  if (rank0) warn_if_slow_blas();
  GA_CHECK(!config.trainer.device.is_cuda() || torch::cuda::is_available(),
           "key 'device': cuda requested but this libtorch has no CUDA device");

  // Everything that can fail on bad input happens before output_dir is created.
  torch::manual_seed(config.trainer.seed);
  data::FashionMnist train_data(config.data.directory, "train", config.data.train_limit);
  std::unique_ptr<data::FashionMnist> eval_data;
  if (config.data.eval_limit >= 0 && rank0) {  // rank 0 evaluates and reports
    eval_data = std::make_unique<data::FashionMnist>(config.data.directory, "test", config.data.eval_limit);
  }
  auto model = models::make_image_classifier(config.model, 10);
  const auto geometry = config.trainer.geometry(world);
  if (const auto warning = core::batch_dependence_warning(
          model->module(), geometry.accumulation_steps(), geometry.world_size());
      !warning.empty() && rank0) {
    fmt::print(stderr, "{}\n", warning);
  }

  // Data parallel: connect, refuse mismatched configurations, and hook the
  // reducer onto the parameters in their final device and dtype.
  std::unique_ptr<dist::BucketedGradSync> sync;
  std::unique_ptr<torch::optim::Optimizer> sharded;
  if (env.distributed()) {
    const auto group = dist::connect(env, std::chrono::seconds(config.dist_timeout_s));
    dist::check_same_on_all_ranks(*group, static_cast<int64_t>(std::hash<std::string>{}(config.resolved_yaml) >> 1),
                                  "configuration");
    model->module().to(config.trainer.device, config.trainer.dtype);
    std::vector<torch::Tensor> params;
    for (auto& p : model->module().parameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    dist::GradSyncOptions options;
    options.bucket_bytes = config.ddp_bucket_cap_mb * 1024 * 1024;
    options.sync_each_micro_step = config.sync_each_micro_step;
    sync = std::make_unique<dist::BucketedGradSync>(group, params, options);
    if (config.zero_stage == 1) {
      sharded = std::make_unique<dist::ShardedOptimizer>(group, params, config.trainer.optimizer);
    }
  }

  // Rank 0 writes the outputs; every figure it reports is global.
  core::ObserverList observers;
  std::unique_ptr<io::MetricsWriter> metrics;
  std::unique_ptr<Progress> progress;
  if (rank0) {
    std::filesystem::create_directories(config.output_dir);
    io::write_file_atomically((std::filesystem::path(config.output_dir) / "config.yaml").string(),
                              config.resolved_yaml);
    metrics = std::make_unique<io::MetricsWriter>(config.output_dir);
    progress = std::make_unique<Progress>(stdout, isatty(STDOUT_FILENO) != 0, config.logging_steps);
    observers.add(*metrics);
    observers.add(*progress);
    fmt::print("threads: {}, dtype: {}, device: {}, world size: {}, output: {}\n", threads,
               config.dtype, config.device, world, config.output_dir);
  }
  core::Trainer trainer(config.trainer, *model, train_data, eval_data.get(), observers, sync.get(),
                        std::move(sharded));
  trainer.run();
  if (!rank0) {
    // Memory is per process: every rank leaves its own figure beside the summary.
    io::write_file_atomically(
        (std::filesystem::path(config.output_dir) / fmt::format("rank{}.json", env.rank)).string(),
        nlohmann::json{{"rank", env.rank}, {"peak_rss_mb", io::peak_rss_mb()}}.dump() + "\n");
  }
  return 0;
}

}  // namespace gradaccum::cli
