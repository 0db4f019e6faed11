#include "gradaccum/cli/train_command.h"

#include <unistd.h>

#include <filesystem>
#include <thread>

#include "gradaccum/cli/blas_probe.h"
#include "gradaccum/cli/progress.h"
#include "gradaccum/core/batch_dependence.h"
#include "gradaccum/core/check.h"
#include "gradaccum/core/trainer.h"
#include "gradaccum/data/fashion_mnist.h"
#include "gradaccum/io/config.h"
#include "gradaccum/io/metrics_writer.h"
#include "gradaccum/models/model_factory.h"

namespace gradaccum::cli {

int run_train(const TrainArgs& args) {
  GA_CHECK(args.nproc >= 1, "--nproc must be >= 1, got {}", args.nproc);
  GA_CHECK(args.nproc == 1, "--nproc {}: data-parallel training is not implemented yet", args.nproc);
  const auto config = io::load_config(args.config_path, args.overrides);
  if (args.print_config) {
    fmt::print("{}", config.resolved_yaml);
    return 0;
  }

  // libtorch on Debian starts with one intra-op thread: use what the user gave.
  const int threads = config.threads > 0 ? static_cast<int>(config.threads)
                                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  if (const auto warning = blas_warning(probe_blas()); !warning.empty()) {
    fmt::print(stderr, "{}\n", warning);
  }
  GA_CHECK(!config.trainer.device.is_cuda() || torch::cuda::is_available(),
           "key 'device': cuda requested but this libtorch has no CUDA device");

  // Everything that can fail on bad input happens before output_dir is created.
  torch::manual_seed(config.trainer.seed);
  data::FashionMnist train_data(config.data.directory, "train", config.data.train_limit);
  std::unique_ptr<data::FashionMnist> eval_data;
  if (config.data.eval_limit >= 0) {
    eval_data = std::make_unique<data::FashionMnist>(config.data.directory, "test", config.data.eval_limit);
  }
  auto model = models::make_image_classifier(config.model, 10);
  const auto geometry = config.trainer.geometry(1);
  if (const auto warning = core::batch_dependence_warning(
          model->module(), geometry.accumulation_steps(), geometry.world_size());
      !warning.empty()) {
    fmt::print(stderr, "{}\n", warning);
  }

  std::filesystem::create_directories(config.output_dir);
  io::write_file_atomically((std::filesystem::path(config.output_dir) / "config.yaml").string(),
                            config.resolved_yaml);
  io::MetricsWriter metrics(config.output_dir);
  Progress progress(stdout, isatty(STDOUT_FILENO) != 0, config.logging_steps);
  core::ObserverList observers;
  observers.add(metrics);
  observers.add(progress);

  core::Trainer trainer(config.trainer, *model, train_data, eval_data.get(), observers);
  fmt::print("threads: {}, dtype: {}, device: {}, output: {}\n", threads, config.dtype,
             config.device, config.output_dir);
  trainer.run();
  return 0;
}

}  // namespace gradaccum::cli
