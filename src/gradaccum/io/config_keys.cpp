#include "gradaccum/io/config_keys.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "gradaccum/base/check.h"
#include "gradaccum/base/named_table.h"
#include "gradaccum/core/mixed_precision.h"
#include "gradaccum/io/workload.h"
#include "gradaccum/kernels/custom_kernels.h"
#include "gradaccum/models/model_types.h"
#include "gradaccum/optim/lr_schedule.h"

namespace gradaccum::io {

namespace {

// A numeric key's rule: its text for errors and the reference, and the test.
struct Rule {
  std::string text;
  std::function<bool(double)> ok;
};

std::string with_note(std::string text, const std::string& note) {
  return note.empty() ? text : text + " (" + note + ")";
}
Rule any_value() { return {"", nullptr}; }
Rule at_least(double low, const std::string& note = "") {
  return {with_note(fmt::format(">= {}", low), note), [low](double v) { return v >= low; }};
}
Rule above(double low, const std::string& note = "") {
  return {with_note(fmt::format("> {}", low), note), [low](double v) { return v > low; }};
}
// [low, high): probabilities, betas, fractions.
Rule below_one_from(double low) {
  return {fmt::format("in [{}, 1)", low), [low](double v) { return v >= low && v < 1; }};
}
Rule rule(std::string text, std::function<bool(double)> ok) { return {std::move(text), std::move(ok)}; }

template <typename T>
std::function<bool(const KeyValue&)> numeric_test(const Rule& r) {
  if (!r.ok) return nullptr;
  return [ok = r.ok](const KeyValue& v) { return ok(static_cast<double>(std::get<T>(v))); };
}

// A key's four common fields; the factories below add the rest by name (an aggregate
// initializer that stops early leaves the others to -Wmissing-field-initializers).
ConfigKey key_of(std::string name, KeyType type, std::string default_yaml, std::string help) {
  ConfigKey key;
  key.name = std::move(name);
  key.type = type;
  key.default_yaml = std::move(default_yaml);
  key.help = std::move(help);
  return key;
}

ConfigKey section(std::string name, std::string help) {
  return key_of(std::move(name), KeyType::section, "", std::move(help));
}

ConfigKey integer(std::string name, int64_t value, std::string help, const Rule& r,
                  std::function<void(TrainConfig&, int64_t)> set) {
  ConfigKey key = key_of(std::move(name), KeyType::integer, std::to_string(value), std::move(help));
  key.rule = r.text;
  key.valid = numeric_test<int64_t>(r);
  key.store = [set = std::move(set)](TrainConfig& c, const KeyValue& v) { set(c, std::get<int64_t>(v)); };
  return key;
}

ConfigKey number(std::string name, std::string value, std::string help, const Rule& r,
                 std::function<void(TrainConfig&, double)> set) {
  ConfigKey key = key_of(std::move(name), KeyType::number, std::move(value), std::move(help));
  key.rule = r.text;
  key.valid = numeric_test<double>(r);
  key.store = [set = std::move(set)](TrainConfig& c, const KeyValue& v) { set(c, std::get<double>(v)); };
  return key;
}

ConfigKey boolean(std::string name, bool value, std::string help, std::function<void(TrainConfig&, bool)> set) {
  ConfigKey key = key_of(std::move(name), KeyType::boolean, value ? "true" : "false", std::move(help));
  key.store = [set = std::move(set)](TrainConfig& c, const KeyValue& v) { set(c, std::get<bool>(v)); };
  return key;
}

ConfigKey text(std::string name, std::string value, std::string help,
               std::function<void(TrainConfig&, const std::string&)> set) {
  ConfigKey key = key_of(std::move(name), KeyType::text, std::move(value), std::move(help));
  key.store = [set = std::move(set)](TrainConfig& c, const KeyValue& v) { set(c, std::get<std::string>(v)); };
  return key;
}

ConfigKey choice(std::string name, std::string value, std::vector<std::string> choices, std::string help,
                 std::function<void(TrainConfig&, const std::string&)> set) {
  ConfigKey key = key_of(std::move(name), KeyType::choice, std::move(value), std::move(help));
  key.choices = std::move(choices);
  key.store = [set = std::move(set)](TrainConfig& c, const KeyValue& v) { set(c, std::get<std::string>(v)); };
  return key;
}

// A key whose values are an enum's names: the choices, the default's spelling and the parse all
// come from the enum's one table.
template <typename E>
ConfigKey choice(std::string name, const base::EnumNames<E>& names, E value, std::string help,
                 std::function<void(TrainConfig&, E)> set) {
  std::string spelled = names.name(value);
  if (spelled == "no" || spelled == "yes") spelled = "\"" + spelled + "\"";  // YAML 1.1 would read a boolean
  ConfigKey key = key_of(std::move(name), KeyType::choice, spelled, std::move(help));
  key.choices = names.names();
  key.store = [&names, set = std::move(set)](TrainConfig& c, const KeyValue& v) {
    set(c, names.parse(std::get<std::string>(v), "choice"));  // the choices were checked before
  };
  return key;
}

ConfigKey integer_list(std::string name, std::string value, std::string help,
                       std::function<void(TrainConfig&, const std::vector<int64_t>&)> set) {
  ConfigKey key = key_of(std::move(name), KeyType::integer_list, std::move(value), std::move(help));
  key.store = [set = std::move(set)](TrainConfig& c, const KeyValue& v) { set(c, std::get<std::vector<int64_t>>(v)); };
  return key;
}

// A list of names, any names (module names checked against the model later).
ConfigKey any_names(std::string name, std::string value, std::string help,
                    std::function<void(TrainConfig&, const std::vector<std::string>&)> set) {
  ConfigKey key = key_of(std::move(name), KeyType::names, std::move(value), std::move(help));
  key.store = [set = std::move(set)](TrainConfig& c, const KeyValue& v) {
    set(c, std::get<std::vector<std::string>>(v));
  };
  return key;
}

// A language model's dropout under HF's name; -1 takes the hf_checkpoint's config.json value.
ConfigKey lm_dropout(std::string name, std::string help, double models::ModelConfig::*field) {
  return number(
      std::move(name), "-1", std::move(help),
      rule("in [0, 1), or -1 for the checkpoint's (else 0)", [](double v) { return v == -1 || (v >= 0 && v < 1); }),
      [field](TrainConfig& c, double v) { c.model.*field = v; });
}

std::vector<ConfigKey> make_keys() {
  using core::LastWindow;
  using core::LossNormalization;
  using core::SampleOrder;
  return {
      text("output_dir", "runs/default", "where checkpoints, metrics and the final model go",
           [](TrainConfig& c, const std::string& v) { c.output_dir = v; }),
      integer("seed", 42, "data order, initialization, dropout and random data", any_value(),
              [](TrainConfig& c, int64_t v) { c.trainer.seed = static_cast<uint64_t>(v); }),
      [] {
        auto key = integer("threads", 0, "intra-op threads per process",
                           rule("in [0, max(1024, 4 x cores)] (0 = all cores)",
                                [](double v) { return v >= 0 && v <= static_cast<double>(max_threads()); }),
                           [](TrainConfig& c, int64_t v) { c.threads = v; });
        key.rule_here = [] {
          return fmt::format("; at most {} on this machine of {} cores", max_threads(),
                             std::thread::hardware_concurrency());
        };
        return key;
      }(),
      choice("dtype", "float32", {"float32", "float64"}, "parameters and compute",
             [](TrainConfig& c, const std::string& v) {
               c.trainer.dtype = v == "float64" ? torch::kDouble : torch::kFloat;
             }),
      choice("device", "cpu", {"cpu", "cuda"}, "where the model runs (cuda: NCCL between ranks)",
             [](TrainConfig& c, const std::string& v) {
               c.trainer.device = v == "cuda" ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
             }),

      section("model", "the network (models/model_types.h)"),
      choice("model.type", "cnn", base::names_of(models::model_types()), "the architecture",
             [](TrainConfig& c, const std::string& v) { c.model.type = v; }),
      choice<models::NormKind>("model.norm", models::norm_kind_names(), models::NormKind::group,
                               "image networks' normalization",
                               [](TrainConfig& c, models::NormKind v) { c.model.norm = v; }),
      integer("model.norm_groups", 8, "group norm's groups", at_least(1),
              [](TrainConfig& c, int64_t v) { c.model.norm_groups = v; }),
      integer_list("model.channels", "[32, 64]", "cnn and resnet: conv widths",
                   [](TrainConfig& c, const std::vector<int64_t>& v) { c.model.channels = v; }),
      choice<models::MemoryFormat>(
          "model.memory_format", models::memory_format_names(), models::MemoryFormat::automatic,
          "cnn and resnet: activation layout (auto: channels_last for CPU micro-batches of 2+ images)",
          [](TrainConfig& c, models::MemoryFormat v) { c.model.memory_format = v; }),
      integer_list("model.hidden", "[128]", "mlp: dense widths; cnn: its dense layer (the first)",
                   [](TrainConfig& c, const std::vector<int64_t>& v) { c.model.hidden = v; }),
      integer("model.n_layer", 4, "language models: transformer blocks (HF GPT2Config names)", at_least(1),
              [](TrainConfig& c, int64_t v) { c.model.n_layer = v; }),
      integer("model.n_embd", 128, "width (BLOOM's hidden_size)", at_least(1),
              [](TrainConfig& c, int64_t v) { c.model.n_embd = v; }),
      integer("model.n_head", 4, "attention heads (divides n_embd)", at_least(1),
              [](TrainConfig& c, int64_t v) { c.model.n_head = v; }),
      integer("model.n_positions", 128, "gpt2's context; bloom (ALiBi) has no limit", at_least(1),
              [](TrainConfig& c, int64_t v) { c.model.n_positions = v; }),
      integer("model.n_kv_head", 0, "llama, qwen2, qwen3, mistral: key-value heads (divides n_head)",
              at_least(0, "0 = n_head"), [](TrainConfig& c, int64_t v) { c.model.n_kv_head = v; }),
      integer("model.head_dim", 0, "llama, qwen2, qwen3, mistral: channels per head",
              at_least(0, "0 = n_embd / n_head"), [](TrainConfig& c, int64_t v) { c.model.head_dim = v; }),
      integer("model.intermediate_size", 0, "llama, qwen2, qwen3, mistral: the SwiGLU's width",
              at_least(0, "0 = 4 n_embd"), [](TrainConfig& c, int64_t v) { c.model.intermediate_size = v; }),
      number("model.rope_theta", "10000.0", "llama, qwen2, qwen3, mistral: RoPE's base", at_least(1),
             [](TrainConfig& c, double v) { c.model.rope_theta = v; }),
      integer("model.sliding_window", 0, "mistral, qwen2, qwen3: every layer's attention window",
              at_least(0, "0 = none"), [](TrainConfig& c, int64_t v) { c.model.sliding_window = v; }),
      integer("model.vocab_size", 0, "the embedding's rows (0 = the tokenizer's)", at_least(0, "0 = the tokenizer's"),
              [](TrainConfig& c, int64_t v) { c.model.vocab_size = v; }),
      text("model.hf_checkpoint", "\"\"", "start from an HF checkpoint directory or a .gguf file instead",
           [](TrainConfig& c, const std::string& v) { c.model.hf_checkpoint = v; }),
      lm_dropout("model.resid_pdrop",
                 "dropout, HF's names (-1 = the hf_checkpoint's config.json, else 0); gpt2: residual branches",
                 &models::ModelConfig::resid_pdrop),
      lm_dropout("model.embd_pdrop", "gpt2: after the embeddings", &models::ModelConfig::embd_pdrop),
      lm_dropout("model.attn_pdrop", "gpt2: attention probabilities", &models::ModelConfig::attn_pdrop),
      lm_dropout("model.hidden_dropout", "bloom: residual branches", &models::ModelConfig::hidden_dropout),
      lm_dropout("model.attention_dropout", "bloom, llama, qwen2, qwen3, mistral: attention probabilities",
                 &models::ModelConfig::attention_dropout),
      number("model.dropout", "0.0", "cnn: after the dense layer", below_one_from(0),
             [](TrainConfig& c, double v) { c.model.dropout = v; }),
      choice<models::DropoutRng>("model.dropout_rng", models::dropout_rng_names(), models::DropoutRng::per_sample,
                                 "per_sample: masks independent of the decomposition; libtorch: its generator",
                                 [](TrainConfig& c, models::DropoutRng v) { c.model.dropout_rng = v; }),

      section("lora", "LoRA adapters on a language model's Linear layers, in PEFT's format (models/lora.h)"),
      any_names("lora.target_modules", "[]",
                "the Linear layers to adapt, as HF names them (q_proj, c_attn, query_key_value, ...); [] = no LoRA",
                [](TrainConfig& c, const std::vector<std::string>& v) { c.lora.target_modules = v; }),
      integer("lora.r", 8, "the adapters' rank", above(0), [](TrainConfig& c, int64_t v) { c.lora.r = v; }),
      number("lora.alpha", "8.0", "scaling = alpha / r (alpha / sqrt(r) with use_rslora)", above(0),
             [](TrainConfig& c, double v) { c.lora.alpha = v; }),
      number("lora.dropout", "0.0", "on the adapters' input (per sample, as model.dropout_rng says)", below_one_from(0),
             [](TrainConfig& c, double v) { c.lora.dropout = v; }),
      boolean("lora.use_rslora", false, "rank-stabilized scaling alpha / sqrt(r)",
              [](TrainConfig& c, bool v) { c.lora.use_rslora = v; }),
      any_names("lora.modules_to_save", "[]",
                "modules trained in full beside the adapters (a classifier's score always)",
                [](TrainConfig& c, const std::vector<std::string>& v) { c.lora.modules_to_save = v; }),
      choice<torch::ScalarType>("lora.base_dtype", models::lora_base_dtype_names(), torch::kFloat,
                                "the frozen base's Linear weights",
                                [](TrainConfig& c, torch::ScalarType v) { c.lora.base_dtype = v; }),
      text("lora.init_from", "\"\"",
           "a PEFT adapter directory the adapters start from; \"\" = fresh (A random, B zero)",
           [](TrainConfig& c, const std::string& v) { c.lora.init_from = v; }),

      section("data", "what the model learns from (io/workload.h)"),
      choice("data.type", "fashion_mnist", base::names_of(data_types()), "the dataset",
             [](TrainConfig& c, const std::string& v) { c.data.type = v; }),
      text("data.directory", "\"\"", "fashion_mnist: \"\" = /usr/share/datasets/fashion-mnist",
           [](TrainConfig& c, const std::string& v) { c.data.directory = v; }),
      text("data.path", "\"\"", "text: a .txt (one document per line) or .jsonl file",
           [](TrainConfig& c, const std::string& v) { c.data.path = v; }),
      text("data.eval_path", "\"\"", "text: evaluation file (\"\" = split off eval_fraction)",
           [](TrainConfig& c, const std::string& v) { c.data.eval_path = v; }),
      text("data.tokenizer", "\"\"", "\"\" = $GRADACCUM_TOKENIZER_DIR, else /var/lib/gradaccum/gpt2",
           [](TrainConfig& c, const std::string& v) { c.data.tokenizer = v; }),
      integer("data.max_length", 128, "tokens per sample (truncation, or the block size when packing)", at_least(2),
              [](TrainConfig& c, int64_t v) { c.data.max_length = v; }),
      boolean("data.packing", false, "join documents into blocks of max_length (causal LM)",
              [](TrainConfig& c, bool v) { c.data.packing = v; }),
      boolean("data.group_by_length", false, "sort each window's samples by length (exact; less padding)",
              [](TrainConfig& c, bool v) { c.trainer.group_by_length = v; }),
      number("data.eval_fraction", "0.1", "kjv, kjv_testament, text without eval_path, random_tokens",
             below_one_from(0), [](TrainConfig& c, double v) { c.data.eval_fraction = v; }),
      boolean("data.balanced", false, "kjv_testament: as many Old as New Testament verses",
              [](TrainConfig& c, bool v) { c.data.balanced = v; }),
      integer("data.train_limit", 0, "the first (spread) training samples only", at_least(0, "0 = all"),
              [](TrainConfig& c, int64_t v) { c.data.train_limit = v; }),
      integer("data.eval_limit", 0, "evaluation samples (0 = all, < 0 = no evaluation)", any_value(),
              [](TrainConfig& c, int64_t v) { c.data.eval_limit = v; }),
      integer("data.vocab_size", 0, "random_tokens: ids in [0, vocab_size) (required, >= 2; no tokenizer)", any_value(),
              [](TrainConfig& c, int64_t v) { c.data.vocab_size = v; }),
      integer("data.train_size", 4096, "random_tokens: training rows of max_length ids, seeded by seed", at_least(1),
              [](TrainConfig& c, int64_t v) { c.data.train_size = v; }),
      choice<data::TableFormat>("data.format", data::table_format_names(), data::TableFormat::by_extension,
                                "text_classification: auto = by the extension (.jsonl/.json, .csv, .tsv/.tab)",
                                [](TrainConfig& c, data::TableFormat v) { c.data.format = v; }),
      text("data.text_field", "text",
           "text_classification: a JSON key, or a CSV/TSV column: header name or 0-based index",
           [](TrainConfig& c, const std::string& v) { c.data.text_field = v; }),
      text("data.label_field", "label", "text_classification: the label's JSON key or column, as text_field",
           [](TrainConfig& c, const std::string& v) { c.data.label_field = v; }),
      choice<data::HeaderRow>("data.header", data::header_row_names(), data::HeaderRow::by_fields,
                              "text_classification, CSV/TSV: a header row (auto: when a field is a name, not an index)",
                              [](TrainConfig& c, data::HeaderRow v) { c.data.header = v; }),
      choice<data::LabelKind>("data.labels", data::label_kind_names(), data::LabelKind::by_values,
                              "text_classification: index = integers 0..K-1; name = each value a class, sorted "
                              "(id2label); auto: by the values",
                              [](TrainConfig& c, data::LabelKind v) { c.data.labels = v; }),
      number("data.test_fraction", "0.0",
             "text_classification: a stratified test split of data.path, evaluated once at the end (summary.json)",
             below_one_from(0), [](TrainConfig& c, double v) { c.data.test_fraction = v; }),

      section("sample", "causal LMs: a generated sample printed at the end"),
      text("sample.prompt", "\"\"", "\"\" = none", [](TrainConfig& c, const std::string& v) { c.sample.prompt = v; }),
      integer("sample.max_new_tokens", SampleConfig{}.max_new_tokens, "tokens to generate", at_least(0),
              [](TrainConfig& c, int64_t v) { c.sample.max_new_tokens = v; }),
      number("sample.temperature", "0.8", "softmax temperature", at_least(0, "0 = greedy"),
             [](TrainConfig& c, double v) { c.sample.temperature = v; }),
      integer("sample.top_k", SampleConfig{}.top_k, "sample among the k likeliest (also generate --top-k's default)",
              at_least(0, "0 = all"), [](TrainConfig& c, int64_t v) { c.sample.top_k = v; }),

      [] {
        auto key = integer("per_device_train_batch_size", 16, "b: samples per micro-step and process (auto: planned)",
                           at_least(1, "or auto"),
                           [](TrainConfig& c, int64_t v) { c.trainer.per_device_train_batch_size = v; });
        key.allows_auto = true;
        return key;
      }(),
      integer("per_device_eval_batch_size", 500, "samples per evaluation forward", at_least(1),
              [](TrainConfig& c, int64_t v) { c.trainer.per_device_eval_batch_size = v; }),
      [] {
        auto key = integer("gradient_accumulation_steps", 4, "N: micro-steps per optimizer step (auto: planned)",
                           at_least(1), [](TrainConfig& c, int64_t v) { c.trainer.gradient_accumulation_steps = v; });
        key.allows_auto = true;
        return key;
      }(),
      integer("global_batch_size", 0, "> 0: N = global / (b x world)", at_least(0, "0 = b x N x world"),
              [](TrainConfig& c, int64_t v) { c.trainer.global_batch_size = v; }),
      integer("num_train_epochs", 3, "passes over the training data", at_least(1),
              [](TrainConfig& c, int64_t v) { c.trainer.num_train_epochs = v; }),
      integer("max_steps", 0, "optimizer steps", at_least(0, "0 = use num_train_epochs"),
              [](TrainConfig& c, int64_t v) { c.trainer.max_steps = v; }),
      choice<optim::OptimizerType>("optim", optim::optimizer_type_names(), optim::OptimizerType::adamw, "the optimizer",
                                   [](TrainConfig& c, optim::OptimizerType v) { c.trainer.optimizer.type = v; }),
      number("learning_rate", "2.0e-3", "the schedule's peak", at_least(0),
             [](TrainConfig& c, double v) { c.trainer.optimizer.learning_rate = v; }),
      number("weight_decay", "0.0", "decoupled (adamw) or L2 (sgd)", at_least(0),
             [](TrainConfig& c, double v) { c.trainer.optimizer.weight_decay = v; }),
      number("momentum", "0.0", "sgd", below_one_from(0),
             [](TrainConfig& c, double v) { c.trainer.optimizer.momentum = v; }),
      boolean("nesterov", false, "sgd, with momentum > 0",
              [](TrainConfig& c, bool v) { c.trainer.optimizer.nesterov = v; }),
      number("adam_beta1", "0.9", "adamw", below_one_from(0),
             [](TrainConfig& c, double v) { c.trainer.optimizer.adam_beta1 = v; }),
      number("adam_beta2", "0.999", "adamw", below_one_from(0),
             [](TrainConfig& c, double v) { c.trainer.optimizer.adam_beta2 = v; }),
      number("adam_epsilon", "1.0e-8", "adamw", above(0),
             [](TrainConfig& c, double v) { c.trainer.optimizer.adam_epsilon = v; }),
      choice<optim::ScheduleType>("lr_scheduler_type", optim::schedule_type_names(), optim::ScheduleType::cosine,
                                  "over optimizer steps",
                                  [](TrainConfig& c, optim::ScheduleType v) { c.trainer.lr_scheduler_type = v; }),
      integer("warmup_steps", 0, "linear warmup, in optimizer steps", at_least(0),
              [](TrainConfig& c, int64_t v) { c.trainer.warmup_steps = v; }),
      number("warmup_ratio", "0.0", "warmup as a fraction of the steps (when warmup_steps is 0)",
             rule("in [0, 1]", [](double v) { return v >= 0 && v <= 1; }),
             [](TrainConfig& c, double v) { c.trainer.warmup_ratio = v; }),
      number("max_grad_norm", "1.0", "0 disables clipping", at_least(0, "0 disables clipping"),
             [](TrainConfig& c, double v) { c.trainer.max_grad_norm = v; }),
      choice<core::MixedPrecision>("mixed_precision", core::mixed_precision_names(), core::MixedPrecision::none,
                                   "autocast, docs/mixed_precision.md",
                                   [](TrainConfig& c, core::MixedPrecision v) { c.trainer.mixed_precision = v; }),
      choice<core::Bf16CpuMatmuls>("bf16_cpu_matmuls", core::bf16_cpu_matmuls_names(), core::Bf16CpuMatmuls::automatic,
                                   "bf16 matmuls on CPU (docs/mixed_precision.md)",
                                   [](TrainConfig& c, core::Bf16CpuMatmuls v) { c.bf16_cpu_matmuls = v; }),
      text("custom_kernels", "all", "all | none | a comma-separated list (kernels/custom_kernels.h)",
           [](TrainConfig& c, const std::string& v) {
             kernels::parse_custom_kernels(v);  // names an unknown kernel
             c.custom_kernels = v;
           }),
      section("loss_scaler", "fp16's dynamic loss scaler (torch.cuda.amp.GradScaler's knobs)"),
      number("loss_scaler.init_scale", "65536.0", "the first scale",
             rule("> 0 and finite in float32", [](double v) { return v > 0 && std::isfinite(static_cast<float>(v)); }),
             [](TrainConfig& c, double v) { c.trainer.loss_scaler.init_scale = v; }),
      number("loss_scaler.growth_factor", "2.0", "after growth_interval good steps", above(1),
             [](TrainConfig& c, double v) { c.trainer.loss_scaler.growth_factor = v; }),
      number("loss_scaler.backoff_factor", "0.5", "after an overflow",
             rule("in (0, 1)", [](double v) { return v > 0 && v < 1; }),
             [](TrainConfig& c, double v) { c.trainer.loss_scaler.backoff_factor = v; }),
      integer("loss_scaler.growth_interval", 2000, "good optimizer steps before the scale grows", at_least(1),
              [](TrainConfig& c, int64_t v) { c.trainer.loss_scaler.growth_interval = v; }),
      boolean("gradient_checkpointing", false,
              "Decoder LMs (GPT-2, BLOOM, the Llama family): recompute each block's activations in backward",
              [](TrainConfig& c, bool v) { c.model.gradient_checkpointing = v; }),
      integer("loss_chunk_tokens", 0,
              "causal LMs: the fused LM head + loss works on chunks of this many tokens (0 = automatic, ~64 MiB of "
              "logits; 512 MiB on a GPU)",
              at_least(0, "0 = automatic"), [](TrainConfig& c, int64_t v) { c.model.loss_chunk_tokens = v; }),
      choice<LossNormalization>("loss_normalization", core::loss_normalization_names(), LossNormalization::window,
                                "window: the exact mean over the window; micro_batch: the naive mean of means",
                                [](TrainConfig& c, LossNormalization v) { c.trainer.loss_normalization = v; }),
      choice<LastWindow>("last_window", core::last_window_names(), LastWindow::partial,
                         "the epoch's last, short window: trained, dropped, or carried into the next epoch's first",
                         [](TrainConfig& c, LastWindow v) { c.trainer.last_window = v; }),
      choice<SampleOrder>(
          "train_sampling_strategy", core::sample_order_names(), SampleOrder::random,
          "random: a seeded permutation per epoch; sequential: the data's order; longest_first: memory probes",
          [](TrainConfig& c, SampleOrder v) { c.trainer.sample_order = v; }),
      integer("logging_steps", 1, "a metrics line every K optimizer steps", at_least(1),
              [](TrainConfig& c, int64_t v) { c.logging_steps = v; }),
      [] {
        ConfigKey key =
            key_of("report_to", KeyType::names, "none", "a name or a list: TensorBoard event files in logging_dir");
        key.choices = {"none", "tensorboard"};
        key.store = [](TrainConfig& c, const KeyValue& v) {
          const auto& names = std::get<std::vector<std::string>>(v);
          c.report_to.clear();
          for (const auto& name : names) {
            if (name != "none" && std::find(c.report_to.begin(), c.report_to.end(), name) == c.report_to.end()) {
              c.report_to.push_back(name);
            }
          }
          GA_CHECK(c.report_to.empty() || std::find(names.begin(), names.end(), "none") == names.end(),
                   "key 'report_to': 'none' cannot be combined with other names");
        };
        return key;
      }(),
      text("logging_dir", "\"\"", "\"\" = <output_dir>/runs",
           [](TrainConfig& c, const std::string& v) { c.logging_dir = v; }),
      integer("grad_flow_steps", -1, "per-parameter gradient statistics every K steps (-1 = logging_steps, 0 = off)",
              rule(">= 0, or -1 for logging_steps", [](double v) { return v >= -1; }),
              [](TrainConfig& c, int64_t v) { c.trainer.grad_flow_steps = v; }),
      integer("profile_from_step", 0,
              "trace optimizer steps K.. with libtorch's profiler into <output_dir>/profiler (Chrome trace)",
              at_least(0, "0 = off"), [](TrainConfig& c, int64_t v) { c.profile_from_step = v; }),
      integer("profile_steps", 3, "how many optimizer steps profile_from_step traces", at_least(1),
              [](TrainConfig& c, int64_t v) { c.profile_steps = v; }),
      integer("eval_steps", 0, "evaluate every K optimizer steps", at_least(0, "0 = at the end only"),
              [](TrainConfig& c, int64_t v) { c.trainer.eval_steps = v; }),
      integer("save_steps", 0, "> 0: a checkpoint every save_steps optimizer steps (and at the end)",
              at_least(0, "0 = at the end only"), [](TrainConfig& c, int64_t v) { c.trainer.save_steps = v; }),
      integer("save_total_limit", 0, "> 0: keep only the newest K checkpoints", at_least(0, "0 = keep all"),
              [](TrainConfig& c, int64_t v) { c.save_total_limit = v; }),
      number("save_interval_s", "0", "> 0: also a checkpoint after the first step this long after the last save",
             at_least(0, "seconds; 0 = off"), [](TrainConfig& c, double v) { c.trainer.save_interval_s = v; }),
      choice("save_on_error", "stop", {"stop", "continue"},
             "a checkpoint that cannot be written (disk full): stop the run, or go on without it",
             [](TrainConfig& c, const std::string& v) { c.continue_after_failed_save = v == "continue"; }),
      text("resume_from_checkpoint", "\"\"",
           "a checkpoint directory, \"latest\" (under output_dir), or \"auto\" (latest if there is one, else a "
           "fresh start)",
           [](TrainConfig& c, const std::string& v) { c.resume_from_checkpoint = v; }),
      boolean("overwrite_output_dir", false, "true: a new run may start in an output_dir that holds checkpoints",
              [](TrainConfig& c, bool v) { c.overwrite_output_dir = v; }),
      boolean("allow_batch_change", false, "resume with another global batch size (not exact)",
              [](TrainConfig& c, bool v) { c.allow_batch_change = v; }),
      choice<core::NanPolicy>("nan_policy", core::nan_policy_names(), core::NanPolicy::abort,
                              "what a non-finite window loss does",
                              [](TrainConfig& c, core::NanPolicy v) { c.trainer.nan_policy = v; }),
      integer("dist_timeout", 60, "seconds before a stalled rank is an error", at_least(1, "seconds"),
              [](TrainConfig& c, int64_t v) { c.dist_timeout_s = v; }),
      integer("ddp_bucket_cap_mb", 25, "gradient all-reduce bucket size", at_least(1),
              [](TrainConfig& c, int64_t v) { c.ddp_bucket_cap_mb = v; }),
      boolean("sync_each_micro_step", false, "true: all-reduce every micro-step (comparison only)",
              [](TrainConfig& c, bool v) { c.sync_each_micro_step = v; }),
      integer("zero_stage", 0,
              "1: shard optimizer state across ranks (ZeRO-1); 2: and the gradients (ZeRO-2); 3: and the "
              "parameters, gathered per unit (ZeRO-3); one process runs 0",
              rule("0, 1, 2 or 3", [](double v) { return v == 0 || v == 1 || v == 2 || v == 3; }),
              [](TrainConfig& c, int64_t v) { c.zero_stage = v; }),
      choice<dist::GradShardPolicy>(
          "sharded_grad_sync", dist::grad_shard_policy_names(), dist::GradShardPolicy::automatic,
          "zero_stage 2 and 3: each_micro_step reduce-scatters every micro-step (N collectives, 1/W of the gradient "
          "held), defer once at the window's end (1 collective, the whole gradient held), auto: defer when the "
          "whole gradient fits in half the memory available",
          [](TrainConfig& c, dist::GradShardPolicy v) { c.sharded_grad_sync = v; }),
      boolean("deterministic_accumulation", false,
              "true: for a fixed b, bit-identical gradients for every N x W (W a power of two)",
              [](TrainConfig& c, bool v) { c.trainer.deterministic_accumulation = v; }),
      integer("max_tokens_per_micro_batch", 0,
              "> 0: cut each window into micro-batches of at most this many padded tokens (N varies)",
              at_least(0, "0 = b rows per micro-batch"),
              [](TrainConfig& c, int64_t v) { c.trainer.max_tokens_per_micro_batch = v; }),
      integer("window_tokens", 0,
              "> 0: a window closes where its samples' targets reach this many tokens (N varies; "
              "gradient_accumulation_steps unused)",
              at_least(0, "0 = windows of b x N x W samples"),
              [](TrainConfig& c, int64_t v) { c.trainer.window_tokens = v; }),
      boolean("oom_recovery", true,
              "a window that runs out of memory is trained again at half the micro-batch, twice the steps",
              [](TrainConfig& c, bool v) { c.trainer.oom_recovery = v; }),
  };
}

std::string type_name(const ConfigKey& key) {
  switch (key.type) {
    case KeyType::integer:
      return key.allows_auto ? "integer or auto" : "integer";
    case KeyType::number:
      return "number";
    case KeyType::boolean:
      return "boolean";
    case KeyType::text:
      return "string";
    case KeyType::choice:
      return "choice";
    case KeyType::integer_list:
      return "list of integers";
    case KeyType::names:
      return "name or list of names";
    case KeyType::section:
      return "section";
  }
  return "";
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

// Markdown table cells: a '|' would end the cell.
std::string cell(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

}  // namespace

int64_t max_threads() { return std::max<int64_t>(1024, 4 * static_cast<int64_t>(std::thread::hardware_concurrency())); }

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = make_keys();
  return keys;
}

const ConfigKey* find_config_key(const std::string& name) {
  for (const auto& key : config_keys()) {
    if (key.name == name) return &key;
  }
  return nullptr;
}

const std::string& default_config_yaml() {
  static const std::string yaml = [] {
    std::string out;
    for (const auto& key : config_keys()) {
      const auto dot = key.name.rfind('.');
      const std::string indent(
          dot == std::string::npos ? 0 : 2 * static_cast<size_t>(std::count(key.name.begin(), key.name.end(), '.')),
          ' ');
      auto line = indent + key.name.substr(dot == std::string::npos ? 0 : dot + 1) + ":";
      if (key.type != KeyType::section) line += " " + key.default_yaml;
      // A choice's comment lists its values: the file a user starts from shows what is allowed.
      const auto comment = key.choices.empty() ? key.help : join(key.choices, " | ") + ": " + key.help;
      if (!comment.empty()) line += std::string(line.size() < 34 ? 34 - line.size() : 1, ' ') + "# " + comment;
      out += line + "\n";
    }
    return out;
  }();
  return yaml;
}

// What a key's one-line help cannot say: the reference's "In more words" section (printed in the
// key table's order). Each name must be a key: the reference refuses a stale one.
const std::vector<std::pair<std::string, std::string>>& key_details() {
  static const std::vector<std::pair<std::string, std::string>> details{
      {"output_dir",
       "holds `config.yaml` (the resolved configuration), `metrics.jsonl`, `summary.json`, the "
       "checkpoints and `final/` ([usage.md](usage.md))"},
      {"seed", "the model's initialization, the per-epoch data permutation, dropout masks and random data"},
      {"device", "`cuda` needs a CUDA build of libtorch (`-DGRADACCUM_WITH_CUDA=ON`; `scripts/gpu_check.sh`)"},
      {"lora.init_from",
       "continues training an adapter: its `adapter_model.safetensors` gives the adapters' and "
       "`modules_to_save`'s starting values (the optimizer starts fresh); its `adapter_config.json` "
       "must agree with this section on `r`, `alpha`, `use_rslora` and `target_modules`, and its "
       "tensors must be exactly the ones this run trains. Resuming a run is `resume_from_checkpoint`, not this"},
      {"model.hf_checkpoint",
       "an HF directory (`config.json` + `model.safetensors`, or shards) or a Llama-family `.gguf` file; "
       "`model.type` is taken from it"},
      {"model.memory_format",
       "`channels_last`: libtorch's channels-last convolution and pooling, GroupNorm as the engine's own node "
       "(`kernels/group_norm.h`), 0.75–0.9 of the time per micro-step on the CPU; `auto` keeps a single image "
       "in NCHW, where ATen's im2col convolution has no channels-last path, and a GPU, where it is not measured. "
       "Parameters, gradients and checkpoints keep the default layout either way"},
      {"model.dropout_rng",
       "`per_sample`: each sample's mask is a pure function of (seed, step, sample, site, position), so dropout "
       "does not depend on the decomposition ([exactness.md](exactness.md))"},
      {"data.train_size",
       "`random_tokens`: `train_size` rows of `max_length` uniform ids in [0, `vocab_size`), a pure function of "
       "`seed`, labels = inputs, no padding and no tokenizer; evaluation on ⌊`train_size` × `eval_fraction`⌋ "
       "further rows of the same stream. For timing and scaling runs: the loss tends to ln(`vocab_size`)"},
      {"data.train_limit", "the first K images; for text, K samples spread evenly over the ordered corpus"},
      {"gradient_accumulation_steps", "*N*; or set `global_batch_size` and *N* is derived as B / (b × W)"},
      {"weight_decay",
       "reaches matrices and embeddings, not biases and normalization gains (HF Trainer's split; nanoGPT's and "
       "llm.c's rule)"},
      {"mixed_precision",
       "parameters, optimizer state and accumulated gradients stay float32 ([mixed_precision.md](mixed_precision.md)); "
       "on a CPU without AVX512-FP16, fp16's matmuls run as float32 GEMMs on float16-rounded operands"},
      {"bf16_cpu_matmuls",
       "`float32`: float32 GEMMs on bfloat16-rounded operands (bfloat16 products, float32 sums, as bf16 hardware "
       "does); `libtorch`: its bfloat16 kernels; `auto`: `float32` on CPUs without AVX512-BF16 or AMX, where "
       "libtorch's bfloat16 GEMM is emulated (2–90× slower than float32)"},
      {"custom_kernels",
       "the engine's hand-written CPU kernels that still beat libtorch end to end ([BENCHMARKS.md](../BENCHMARKS.md)), "
       "`mkl_intel_path` (MKL's Intel code on other vendors' CPUs; fixed at the process's first GEMM) and "
       "`heap_retention` (glibc keeps freed blocks in its heap); `none` runs libtorch's own paths everywhere. "
       "The header line `kernels: …; custom: …` says which run"},
      {"loss_chunk_tokens",
       "the fused LM head + cross-entropy never holds the full logits: chunks of ~64 MiB of float32 logits on the "
       "CPU, ~512 MiB on a GPU"},
      {"loss_normalization", "`micro_batch` is the naive mean of means, for comparison ([exactness.md](exactness.md))"},
      {"last_window",
       "`partial`: the shorter last window is normalized by its own count; `carry`: the remainder opens the next "
       "epoch's first window ([exactness.md](exactness.md))"},
      {"train_sampling_strategy",
       "`sequential` replays the data file's order every epoch (to match another trainer's batches); "
       "`longest_first` is what `gradaccum plan`'s probes use"},
      {"grad_flow_steps", "per-parameter gradient statistics ([usage.md](usage.md), \"What a run writes\")"},
      {"profile_from_step", "each rank's operators go to `<output_dir>/profiler/trace-rank<R>.json`"},
      {"report_to", "`tensorboard` (or `[tensorboard]`, HF's spelling): event files in `logging_dir`"},
      {"max_tokens_per_micro_batch",
       "> 0: each window's samples are cut into micro-batches of at most K padded tokens instead of *b* rows "
       "([exactness.md](exactness.md))"},
      {"window_tokens",
       "> 0: a window closes where its samples' targets (non-ignored tokens) reach T; its gradient is normalized by "
       "its own count, *N* follows, the schedule counts these windows ([exactness.md](exactness.md))"},
      {"oom_recovery",
       "a window whose micro-step runs out of memory is trained again at half the micro-batch and twice the "
       "micro-steps ([exactness.md](exactness.md))"},
      {"deterministic_accumulation",
       "for a fixed micro-batch size, gradients bit-identical in float32 for every N × W with W a power of two "
       "([exactness.md](exactness.md))"},
      {"nan_policy", "`abort` names the step and the micro-step; `skip` leaves the weights alone for that step"},
  };
  return details;
}

std::string config_reference_markdown() {
  std::string out =
      "# Configuration reference\n\n"
      "Generated from the key table (`include/gradaccum/io/config_keys.h`) by `gradaccum config --reference`;\n"
      "a test keeps this file equal to that output. A YAML file (`gradaccum train CONFIG`) and\n"
      "`--set key=value` set these keys; `gradaccum train --print-config` prints the resolved whole.\n"
      "Names follow HF TrainingArguments where one exists. Every number must be finite (`.inf` and `.nan`\n"
      "are refused), and a file names each key once.\n\n"
      "Model types (`model.type`):\n\n";
  for (const auto& type : models::model_types()) {
    out += fmt::format("- `{}` ({}): {}\n", type.name,
                       type.family == models::ModelFamily::image ? "images" : "token ids", type.help);
  }
  out += "\nData types (`data.type`):\n\n";
  for (const auto& type : data_types()) {
    out += fmt::format("- `{}` ({}): {}\n", type.name,
                       type.family == models::ModelFamily::image ? "images" : "token ids", type.help);
  }
  out += "\n| key | type | default | allowed | what |\n|---|---|---|---|---|\n";
  for (const auto& key : config_keys()) {
    if (key.type == KeyType::section) {
      out += fmt::format("| **{}:** | section | | | {} |\n", key.name, cell(key.help));
      continue;
    }
    const auto allowed = key.choices.empty() ? key.rule : join(key.choices, " | ");
    out += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", key.name, type_name(key), cell(key.default_yaml),
                       cell(allowed), cell(key.help));
  }
  out += "\n## In more words\n\n";
  for (const auto& [name, text] : key_details()) {
    GA_CHECK(find_config_key(name) != nullptr, "key_details: '{}' is not a key", name);
  }
  for (const auto& key : config_keys()) {
    for (const auto& [name, text] : key_details()) {
      if (name == key.name) out += fmt::format("- `{}`: {}.\n", name, text);
    }
  }
  out +=
      "\nAn unknown key, a wrong type or an impossible value stops the run before anything is written, with one "
      "line naming\nthe key: `gradaccum: error: key 'learning_rate': must be >= 0, got -0.1`.\n";
  return out;
}

}  // namespace gradaccum::io
