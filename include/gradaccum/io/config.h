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
#include "gradaccum/data/text_classification.h"
#include "gradaccum/io/run_settings.h"
#include "gradaccum/models/generation.h"
#include "gradaccum/models/lora.h"
#include "gradaccum/models/model_factory.h"

namespace gradaccum::io {

struct DataConfig {
  std::string type = "fashion_mnist";  // a name in io/workload.h's data_types()
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
  // text_classification (data/text_classification.h):
  data::TableFormat format = data::TableFormat::by_extension;
  std::string text_field = "text";  // a JSON key, a CSV/TSV header name, or a 0-based column index
  std::string label_field = "label";
  data::HeaderRow header = data::HeaderRow::by_fields;  // by_fields: when a field is a name
  data::LabelKind labels = data::LabelKind::by_values;
  double test_fraction = 0.0;  // a stratified test split, evaluated once at the end
};

// A sample generated at the end of a causal-LM run.
struct SampleConfig {
  std::string prompt;  // "" = none
  int64_t max_new_tokens = models::GenerationOptions{}.max_new_tokens;
  double temperature = models::GenerationOptions{}.temperature;
  int64_t top_k = models::GenerationOptions{}.top_k;
};

// The resolved configuration: the run's settings (the library's own fields, run_settings.h), the
// trainer's options, and what the program builds from (model, data, the end-of-run sample).
struct TrainConfig : RunSettings {
  // per_device_train_batch_size or gradient_accumulation_steps is `auto`: `gradaccum train` plans
  // b × N of global_batch_size before it starts (cli/plan_command.h); until then b is 1.
  bool plan_decomposition = false;
  models::ModelConfig model;
  models::LoraConfig lora;
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
