#include "gradaccum/cli/train_command.h"

#include <algorithm>
#include <filesystem>

#include "gradaccum/base/check.h"
#include "gradaccum/cli/plan_command.h"
#include "gradaccum/cli/plot_command.h"
#include "gradaccum/dist/environment.h"
#include "gradaccum/io/config.h"
#include "gradaccum/io/workload.h"
#include "gradaccum/models/generation.h"
#include "gradaccum/run/fit.h"
#include "gradaccum/run/launcher.h"

namespace gradaccum::cli {

namespace {

// A language model's final/ also holds the tokenizer's files (gpt2.tiktoken, tokenizer.json, or
// encoder.json + vocab.bpe: whatever it was loaded from), so that `generate` and HF's loaders
// need nothing else.
std::vector<std::string> final_files(const io::Workload& workload) {
  if (!workload.tokenizer || !workload.model.is_language_model()) return {};
  return io::tokenizer_files(*workload.tokenizer);
}

void print_sample(io::Workload& workload, const io::SampleConfig& sample) {
  const auto& tokenizer = *workload.tokenizer;
  if (tokenizer.encode(sample.prompt).empty()) return;
  models::GenerationOptions options;
  options.max_new_tokens = sample.max_new_tokens;
  options.temperature = sample.temperature;
  options.top_k = sample.top_k;
  options.max_positions = workload.model.max_positions;
  options.stop_tokens = models::eos_token_ids(workload.model.hf_config);
  fmt::print("sample: {}{}\n", sample.prompt,
             models::generate_text(*workload.model.causal_lm(), tokenizer, sample.prompt, options));
}

// The configuration's keys as fit()'s options.
run::RunOptions run_options(const io::TrainConfig& config, const io::Workload& workload) {
  run::RunOptions options;
  static_cast<io::RunSettings&>(options) = config;  // the key table stored into the library's own fields
  options.trainer = config.trainer;
  options.items_are_tokens = workload.items_are_tokens;
  options.description = config.resolved_yaml;
  options.data_description = workload.description;
  options.final_files = final_files(workload);
  options.test_data = workload.test.get();
  return options;
}

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
    // The chosen decomposition as keys: the configuration written into output_dir and the ranks
    // --nproc starts read them like any other.
    const auto& chosen = plan.choice->geometry;
    auto overrides = args.overrides;
    for (const auto& o : {fmt::format("per_device_train_batch_size={}", chosen.micro_batch()),
                          fmt::format("gradient_accumulation_steps={}", chosen.accumulation_steps())}) {
      overrides.push_back(o);
      child_args.insert(child_args.end(), {"--set", o});
    }
    config = io::load_config(args.config_path, overrides, world);
    fmt::print("auto: per_device_train_batch_size={} gradient_accumulation_steps={} (planned; global batch {})\n",
               chosen.micro_batch(), chosen.accumulation_steps(), global);
  }
  if (args.nproc > 1) {
    GA_CHECK(!env.distributed(), "--nproc {} inside a launched job (WORLD_SIZE={}): use one launcher", args.nproc,
             env.world_size);
    return run::launch_local(args.nproc, child_args);
  }
  // The process set up first: loading and tokenizing the data uses its threads.
  const run::ProcessSetup process(run::training_process_settings(config, config.trainer, env.local_world_size));
  torch::manual_seed(config.trainer.seed);
  // Rank 0 evaluates and reports; under ZeRO-3 every rank gathers the weights for its evaluations,
  // so every rank knows of them (run::fit: every rank passes the same eval data).
  const bool sharded_weights = config.zero_stage == 3 && env.distributed();
  auto workload = io::make_workload(config, /*with_eval=*/env.rank == 0 || sharded_weights);

  const auto options = run_options(config, workload);
  const auto result = run::fit(options, *workload.model.task, *workload.train, workload.eval.get(),
                               run::model_files(workload.model), nullptr, &process, env);
  if (!result.final_dir.empty() && workload.tokenizer && workload.model.causal_lm() != nullptr &&
      !config.sample.prompt.empty()) {
    print_sample(workload, config.sample);
  }
  if (result.rank == 0 && args.plots) write_plots_and_report(config.output_dir);
  return 0;
}

}  // namespace gradaccum::cli
