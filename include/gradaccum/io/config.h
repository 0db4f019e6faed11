// The run configuration: YAML files and `--set key=value` overrides, with the
// keys of HF TrainingArguments where one exists (DESIGN.md §3).
//
// Resolution: the built-in default configuration, then the user's file merged
// over it, then each override. A key the default does not have, a value of the
// wrong type or an impossible value is a gradaccum::Error naming the key.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gradaccum/core/trainer.h"
#include "gradaccum/models/model_factory.h"

namespace gradaccum::io {

struct DataConfig {
  std::string type = "fashion_mnist";  // fashion_mnist | kjv | kjv_testament | text | random_tokens
  std::string directory;               // the dataset's files; default: the Debian package's path
  std::string path;                    // text: the training file (.txt or .jsonl)
  std::string eval_path;               // text: an evaluation file ("" = split off eval_fraction)
  std::string tokenizer;               // "" = $GRADACCUM_TOKENIZER_DIR, else the setup script's GPT-2 files
  int64_t max_length = 128;
  bool packing = false;
  double eval_fraction = 0.1;
  bool balanced = false;
  int64_t train_limit = 0;    // > 0: the first train_limit training samples
  int64_t eval_limit = 0;     // > 0: the first eval_limit test samples; < 0: no evaluation
  int64_t vocab_size = 0;     // random_tokens: ids in [0, vocab_size), the model's vocabulary
  int64_t train_size = 4096;  // random_tokens: training rows (eval: ⌊train_size·eval_fraction⌋ more)
};

// A sample generated at the end of a causal-LM run.
struct SampleConfig {
  std::string prompt;  // "" = none
  int64_t max_new_tokens = 40;
  double temperature = 0.8;
  int64_t top_k = 40;  // the key's default, and `gradaccum generate --top-k`'s
};

struct TrainConfig {
  std::string output_dir;
  // per_device_train_batch_size or gradient_accumulation_steps is `auto`: `gradaccum train` plans
  // b × N of global_batch_size before it starts (cli/plan_command.h); until then b is 1.
  bool plan_decomposition = false;
  int64_t threads = 0;  // 0: all cores
  std::string dtype = "float32";
  std::string device = "cpu";
  std::string mixed_precision = "no";
  std::string bf16_cpu_matmuls = "auto";  // kernels/float32_cpu_matmuls.h
  std::string custom_kernels = "all";     // kernels/custom_kernels.h
  int64_t logging_steps = 1;
  std::vector<std::string> report_to;  // "tensorboard" (HF's key); empty: none
  std::string logging_dir;             // TensorBoard's event files (resolved: output_dir/runs)
  // Also in trainer.grad_flow_steps (resolved: -1 becomes logging_steps).
  int64_t profile_from_step = 0;  // > 0: libtorch's profiler over steps K..K+profile_steps-1
  int64_t profile_steps = 3;
  int64_t dist_timeout_s = 60;         // collectives and rendezvous fail after this
  int64_t ddp_bucket_cap_mb = 25;      // gradient bucket size
  bool sync_each_micro_step = false;   // comparison only: all-reduce every micro-step
  int64_t zero_stage = 0;              // 1: optimizer state sharded across ranks
  int64_t save_steps = 0;              // also in trainer.save_steps
  int64_t save_total_limit = 0;        // > 0: keep the newest K checkpoints
  std::string resume_from_checkpoint;  // "" | a directory | "latest"
  bool overwrite_output_dir = false;   // a fresh run may start where checkpoints are (HF's key)
  bool allow_batch_change = false;
  models::ModelConfig model;
  DataConfig data;
  SampleConfig sample;
  core::TrainerOptions trainer;
  std::string resolved_yaml;  // the whole resolved configuration, as written to config.yaml
};

// The most intra-op threads a process may ask for (`threads`, `--threads`): max(1024, 4 × the
// cores). Far more than helps, and below where OpenMP fails in its own words or crashes.
int64_t max_threads();

// The built-in default run (the README's main job).
const std::string& default_config_yaml();

// Resolves a configuration. `path` empty: the built-in default alone.
// Overrides are "dotted.key=value", the value parsed as YAML. `world_size`
// enters the batch arithmetic (global_batch_size = b × N × world).
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides, int64_t world_size = 1);

}  // namespace gradaccum::io
