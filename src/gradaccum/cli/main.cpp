// The `gradaccum` program: parses the command line and turns exceptions into a
// one-line message and a non-zero exit status. Nothing else exits the process.
#include <fmt/format.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "gradaccum/base/check.h"
#include "gradaccum/cli/config_command.h"
#include "gradaccum/cli/export_command.h"
#include "gradaccum/cli/lm_commands.h"
#include "gradaccum/cli/plan_command.h"
#include "gradaccum/cli/plot_command.h"
#include "gradaccum/cli/tokenize_command.h"
#include "gradaccum/cli/train_command.h"
#include "gradaccum/cli/verify_command.h"
#include "gradaccum/core/out_of_memory.h"
#include "gradaccum/io/config.h"
#include "gradaccum/io/config_keys.h"
#include "gradaccum/run/runtime.h"

namespace {
// c10::Error messages carry a C++ backtrace after the first line.
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// An allocation that failed outside what oom_recovery handles: what failed, the allocator's own
// words, and what to change.
std::string out_of_memory_message(const std::string& cause) {
  return fmt::format(
      "out of memory ({}): lower per_device_train_batch_size, data.max_length or per_device_eval_batch_size, keep "
      "oom_recovery: true, or run `gradaccum plan`",
      cause);
}

// The checks of option values that CLI11 runs as it parses; their message follows the option's
// name ("--threads: must be ...").
// A floating-point option is finite: "inf" and "nan" parse as numbers.
const CLI::Validator kFinite(
    [](std::string& text) {
      char* end = nullptr;
      const double value = std::strtod(text.c_str(), &end);
      return end != text.c_str() && !std::isfinite(value) ? "must be a finite number, got " + text : std::string();
    },
    "");
// --threads follows the `threads` key's rule.
const CLI::Validator kThreads(
    [](std::string& text) {
      const auto& key = *gradaccum::io::find_config_key("threads");
      char* end = nullptr;
      const long long value = std::strtoll(text.c_str(), &end, 10);
      const bool number = end != text.c_str() && *end == '\0';
      return number && !(value >= 0 && value <= gradaccum::io::max_threads())
                 ? "must be " + key.rule + key.rule_here() + ", got " + text
                 : std::string();
    },
    "");
const CLI::Validator kPositive(
    [](std::string& text) {
      char* end = nullptr;
      const long long value = std::strtoll(text.c_str(), &end, 10);
      return end != text.c_str() && *end == '\0' && value < 1 ? "must be >= 1, got " + text : std::string();
    },
    "");

// CLI11's own errors (an unknown option, a missing argument, a value of the wrong type) as one line
// with exit status 2, like a shell tool's usage errors; help and version exit 0 as CLI11 prints them.
int command_line_error(const CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
  std::string message = e.what();
  std::replace(message.begin(), message.end(), '\n', ' ');
  fmt::print(stderr, "gradaccum: error: {} (see gradaccum --help)\n", message);
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gradaccum: exact, fast gradient accumulation on libtorch"};
  app.require_subcommand(1);
  app.set_version_flag("--version",
                       fmt::format("gradaccum {}\nlibtorch: {}\nkernels: {}", GRADACCUM_VERSION,
                                   gradaccum::run::libtorch_description(), gradaccum::run::kernels_description()));

  gradaccum::cli::TrainArgs train;
  auto* train_cmd = app.add_subcommand("train", "Train a model (no CONFIG: the built-in default run)");
  train_cmd->add_option("config", train.config_path, "YAML configuration file");
  train_cmd->add_option("--set", train.overrides, "Override a key: --set key=value (repeatable)")
      ->allow_extra_args(false)
      ->type_name("KEY=VALUE");
  train_cmd->add_flag("--print-config", train.print_config, "Print the resolved configuration and exit");
  train_cmd->add_option("--nproc", train.nproc, "Processes to start on this host (data parallel)");
  train_cmd->add_flag("--plots", train.plots,
                      "At the end, write the figures to OUTPUT_DIR/plots and the run report to OUTPUT_DIR/report.html");

  gradaccum::cli::VerifyArgs verify;
  auto* verify_cmd =
      app.add_subcommand("verify", "Check in float64 that splits of one global batch follow the same trajectory");
  verify_cmd->add_option("config", verify.config_path, "YAML configuration file");
  verify_cmd->add_option("--splits", verify.splits, "Comma-separated BxN splits of one global batch")
      ->capture_default_str();
  verify_cmd->add_option("--steps", verify.steps, "Optimizer steps per split")->capture_default_str();
  verify_cmd->add_option("--tolerance", verify.tolerance, "Largest relative difference accepted")
      ->capture_default_str()
      ->check(kFinite);
  verify_cmd->add_option("--set", verify.overrides, "Override a key: --set key=value (repeatable)")
      ->allow_extra_args(false)
      ->type_name("KEY=VALUE");
  verify_cmd->add_option("--output-dir", verify.output_dir, "Write each split's trajectory to DIR/verify.json");
  verify_cmd->add_flag("--plots", verify.plots, "Also draw them: DIR/plots/verify.png and DIR/report.html");

  gradaccum::cli::PlanArgs plan;
  auto* plan_cmd = app.add_subcommand(
      "plan", "Probe the micro-batches of one global batch for memory and speed; choose the fastest that fits");
  plan_cmd->add_option("config", plan.config_path, "YAML configuration file");
  plan_cmd->add_option("--global-batch", plan.global_batch, "The global batch (default: the configuration's b x N)")
      ->check(kPositive);
  plan_cmd->add_option("--memory", plan.memory,
                       "Memory limit, used as given (no margin): 6000 (MB), 6000M, 512MiB, 441066KiB, 8G, 8GiB "
                       "(default: 90% of what is available)");
  plan_cmd->add_option("--steps", plan.steps, "Optimizer steps per probe")->capture_default_str();
  plan_cmd->add_option("--set", plan.overrides, "Override a key: --set key=value (repeatable)")
      ->allow_extra_args(false)
      ->type_name("KEY=VALUE");
  plan_cmd->add_flag("--json", plan.json, "Print the plan as one JSON object");

  gradaccum::cli::PlotArgs plot;
  auto* plot_cmd = app.add_subcommand(
      "plot", "PNG figures and an HTML report of a run directory (of train, or of verify --output-dir)");
  plot_cmd->add_option("run_dir", plot.run_dir, "The run's output_dir")->required();
  plot_cmd->add_option("--out", plot.out_dir,
                       "Write the figures and report.html here (default: RUN_DIR/plots and RUN_DIR/report.html)");

  gradaccum::cli::TokenizeArgs tokenize;
  auto* tokenize_cmd =
      app.add_subcommand("tokenize", "Print each input line's token ids as a JSON array (--decode: the reverse)");
  tokenize_cmd->add_option("file", tokenize.input_path, "Input file (default: standard input)");
  tokenize_cmd->add_option(
      "--tokenizer", tokenize.tokenizer_dir,
      "A directory with tokenizer.json, gpt2.tiktoken or encoder.json + vocab.bpe; "
      "a .tiktoken file; a .gguf file's tokenizer; or a tokenizer.json (default: $GRADACCUM_TOKENIZER_DIR, else "
      "/var/lib/gradaccum/gpt2)");
  tokenize_cmd->add_flag("--decode", tokenize.decode, "Read JSON arrays of ids and print the text");

  gradaccum::cli::GenerateArgs generate;
  auto* generate_cmd = app.add_subcommand("generate", "Continue a prompt with a trained causal language model");
  generate_cmd
      ->add_option("--checkpoint", generate.checkpoint,
                   "HF checkpoint or LoRA adapter directory (e.g. a run's output_dir/final), or a Llama-family "
                   ".gguf file")
      ->required();
  generate_cmd->add_option("--prompt", generate.prompt, "The text to continue")->required();
  generate_cmd->add_option("--max-new-tokens", generate.max_new_tokens, "Tokens to generate")->capture_default_str();
  generate_cmd->add_option("--temperature", generate.temperature, "Sampling temperature (0 = greedy)")
      ->capture_default_str()
      ->check(kFinite);
  generate_cmd->add_option("--top-k", generate.top_k, "Sample among the k likeliest tokens (0 = all)")
      ->capture_default_str();
  generate_cmd->add_option("--seed", generate.seed, "Sampling seed")->capture_default_str();
  generate_cmd->add_option("--tokenizer", generate.tokenizer, "Tokenizer (default: the checkpoint's own)");
  generate_cmd->add_option("--threads", generate.threads, "Intra-op threads (0 = all cores)")->check(kThreads);
  generate_cmd->add_option("--base", generate.base,
                           "A LoRA adapter's base model, DIR or FILE.gguf (default: the adapter's own)");

  gradaccum::cli::EvalArgs eval;
  auto* eval_cmd = app.add_subcommand(
      "eval", "Mean token loss and perplexity of a text file (one document per line) under a checkpoint");
  eval_cmd
      ->add_option("--checkpoint", eval.checkpoint,
                   "HF checkpoint or LoRA adapter directory, or a Llama-family .gguf file")
      ->required();
  eval_cmd->add_option("file", eval.file, "Text file, one document per line")->required();
  eval_cmd->add_option("--batch-size", eval.batch_size, "Documents per forward pass")->capture_default_str();
  eval_cmd->add_option("--tokenizer", eval.tokenizer, "Tokenizer (default: the checkpoint's own)");
  eval_cmd->add_option("--threads", eval.threads, "Intra-op threads (0 = all cores)")->check(kThreads);
  eval_cmd->add_option("--base", eval.base,
                       "A LoRA adapter's base model, DIR or FILE.gguf (default: the adapter's own)");

  gradaccum::cli::ExportArgs export_args;
  auto* export_cmd = app.add_subcommand("export", "Merge a LoRA adapter into its base and write an HF checkpoint");
  export_cmd
      ->add_option("--merge-lora", export_args.adapter_dir,
                   "The adapter directory (adapter_config.json + adapter_model.safetensors)")
      ->required();
  export_cmd->add_option("out_dir", export_args.out_dir, "Where the merged checkpoint goes")->required();
  export_cmd->add_option("--base", export_args.base, "The base model, DIR or FILE.gguf (default: the adapter's own)");

  gradaccum::cli::ConfigArgs config;
  auto* config_cmd = app.add_subcommand(
      "config",
      "Print the default configuration (every key, its default and help) or, with --reference, the Markdown reference");
  config_cmd->add_flag("--reference", config.reference, "The configuration reference in Markdown (docs/config.md)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return command_line_error(app, e);
  }
  // The ranks started by --nproc get the same command line without it.
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--nproc") {
      ++i;
    } else if (arg.rfind("--nproc=", 0) != 0) {
      train.child_args.push_back(arg);
    }
  }
  try {
    if (train_cmd->parsed()) return gradaccum::cli::run_train(train);
    if (verify_cmd->parsed()) return gradaccum::cli::run_verify(verify);
    if (tokenize_cmd->parsed()) return gradaccum::cli::run_tokenize(tokenize);
    if (generate_cmd->parsed()) return gradaccum::cli::run_generate(generate);
    if (eval_cmd->parsed()) return gradaccum::cli::run_eval(eval);
    if (plot_cmd->parsed()) return gradaccum::cli::run_plot(plot);
    if (plan_cmd->parsed()) return gradaccum::cli::run_plan(plan);
    if (config_cmd->parsed()) return gradaccum::cli::run_config(config);
    if (export_cmd->parsed()) return gradaccum::cli::run_export(export_args);
  } catch (const gradaccum::Error& e) {
    fmt::print(stderr, "gradaccum: error: {}\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    const auto cause = first_line(e.what_without_backtrace());
    fmt::print(stderr, "gradaccum: error: {}\n",
               gradaccum::core::is_out_of_memory(e) ? out_of_memory_message(cause) : cause);
    return 1;
  } catch (const std::exception& e) {
    const auto cause = first_line(e.what());
    fmt::print(stderr, "gradaccum: error: {}\n",
               gradaccum::core::is_out_of_memory(e) ? out_of_memory_message(cause) : cause);
    return 1;
  }
  return 0;
}
