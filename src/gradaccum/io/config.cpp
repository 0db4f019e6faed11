#include "gradaccum/io/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>

#include <fmt/ranges.h>

#include "gradaccum/core/check.h"
#include "gradaccum/core/custom_kernels.h"
#include "gradaccum/data/fashion_mnist.h"

namespace gradaccum::io {

const std::string& default_config_yaml() {
  static const std::string yaml = R"(output_dir: runs/default
seed: 42
threads: 0                        # 0 = all cores
dtype: float32                    # float32 | float64
device: cpu                       # cpu | cuda
model:
  type: cnn                       # mlp | cnn | resnet | gpt2 | bloom
  norm: group                     # batch | group | layer | none (image networks)
  norm_groups: 8
  channels: [32, 64]
  hidden: [128]
  n_layer: 4                      # language models (HF GPT2Config names)
  n_embd: 128
  n_head: 4
  n_positions: 128                # gpt2's context; bloom (ALiBi) has no limit
  vocab_size: 0                   # 0 = the tokenizer's
  hf_checkpoint: ""               # start from an HF checkpoint directory instead
  resid_pdrop: -1                 # dropout, HF's names (-1 = the hf_checkpoint's config.json, else 0); gpt2: residual branches
  embd_pdrop: -1                  # gpt2: after the embeddings
  attn_pdrop: -1                  # gpt2: attention probabilities
  hidden_dropout: -1              # bloom: residual branches
  attention_dropout: -1           # bloom: attention probabilities
  dropout: 0.0                    # cnn: after the dense layer
  dropout_rng: per_sample         # per_sample (masks independent of the decomposition) | libtorch
data:
  type: fashion_mnist             # fashion_mnist | kjv | kjv_testament | text | random_tokens
  directory: ""                   # fashion_mnist: "" = /usr/share/datasets/fashion-mnist
  path: ""                        # text: a .txt (one document per line) or .jsonl file
  eval_path: ""                   # text: evaluation file ("" = split off eval_fraction)
  tokenizer: ""                   # "" = $GRADACCUM_TOKENIZER_DIR, else /var/lib/gradaccum/gpt2
  max_length: 128                 # tokens per sample (truncation, or the block size when packing)
  packing: false                  # join documents into blocks of max_length (causal LM)
  group_by_length: false          # sort each window's samples by length (exact; less padding)
  eval_fraction: 0.1              # kjv, kjv_testament, text without eval_path, random_tokens
  balanced: false                 # kjv_testament: as many Old as New Testament verses
  train_limit: 0
  eval_limit: 0
  vocab_size: 0                   # random_tokens: ids in [0, vocab_size) (required, >= 2; no tokenizer)
  train_size: 4096                # random_tokens: training rows of max_length ids, seeded by seed
sample:                           # causal LMs: a generated sample printed at the end
  prompt: ""                      # "" = none
  max_new_tokens: 40
  temperature: 0.8
  top_k: 40
per_device_train_batch_size: 16
per_device_eval_batch_size: 500
gradient_accumulation_steps: 4
global_batch_size: 0              # > 0: N = global / (b x world)
num_train_epochs: 3
max_steps: 0
optim: adamw                      # adamw | sgd
learning_rate: 2.0e-3
weight_decay: 0.0
momentum: 0.0
nesterov: false
adam_beta1: 0.9
adam_beta2: 0.999
adam_epsilon: 1.0e-8
lr_scheduler_type: cosine         # constant | linear | cosine
warmup_steps: 0
warmup_ratio: 0.0
max_grad_norm: 1.0                # 0 disables clipping
mixed_precision: "no"             # no | bf16 | fp16 (autocast, docs/mixed_precision.md)
bf16_cpu_matmuls: auto            # auto | float32 | libtorch: bf16 matmuls on CPU (docs/mixed_precision.md)
custom_kernels: all               # all | none | a comma-separated list (core/custom_kernels.h)
loss_scaler:                      # fp16's dynamic loss scaler (torch.cuda.amp.GradScaler's knobs)
  init_scale: 65536.0
  growth_factor: 2.0
  backoff_factor: 0.5
  growth_interval: 2000           # good optimizer steps before the scale grows
gradient_checkpointing: false     # GPT-2/BLOOM: recompute block activations in backward
loss_chunk_tokens: 0              # causal LMs: the fused LM head + loss works on chunks of this many tokens (0 = automatic, ~64 MiB of logits; 512 MiB on a GPU)
loss_normalization: window        # window (exact mean) | sum | micro_batch (naive)
last_window: partial              # partial | drop | carry (into the next epoch's first window)
train_sampling_strategy: random   # random (a seeded permutation per epoch) | sequential (the data's order) | longest_first (memory probes)
logging_steps: 1
report_to: none                   # none | tensorboard | [tensorboard]: TensorBoard event files in logging_dir
logging_dir: ""                   # "" = <output_dir>/runs
grad_flow_steps: -1               # per-parameter gradient statistics every K steps (-1 = logging_steps, 0 = off)
eval_steps: 0
save_steps: 0                     # > 0: a checkpoint every save_steps optimizer steps (and at the end)
save_total_limit: 0               # > 0: keep only the newest K checkpoints
resume_from_checkpoint: ""        # a checkpoint directory, or "latest" (under output_dir)
allow_batch_change: false         # resume with another global batch size (not exact)
nan_policy: abort                 # abort | skip: what a non-finite window loss does
dist_timeout: 60                  # seconds before a stalled rank is an error
ddp_bucket_cap_mb: 25             # gradient all-reduce bucket size
sync_each_micro_step: false       # true: all-reduce every micro-step (comparison only)
zero_stage: 0                     # 1: shard optimizer state across ranks (ZeRO-1)
deterministic_accumulation: false # true: for a fixed b, bit-identical gradients for every N x W (W a power of two)
max_tokens_per_micro_batch: 0     # > 0: cut each window into micro-batches of at most this many padded tokens (N varies)
window_tokens: 0                  # > 0: a window closes where its samples' targets reach this many tokens (N varies; gradient_accumulation_steps unused)
oom_recovery: true                # a window that runs out of memory is trained again at half the micro-batch, twice the steps
)";
  return yaml;
}

namespace {

std::string describe(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

// Merges `user` into `base`, refusing keys `base` does not have.
void merge(YAML::Node base, const YAML::Node& user, const std::string& prefix) {
  GA_CHECK(user.IsMap(), "{}: expected a mapping of keys, got {}",
           prefix.empty() ? "configuration" : prefix, describe(user));
  for (const auto& item : user) {
    GA_CHECK(item.first.IsScalar(), "{}: a key must be a name, got {}",
             prefix.empty() ? "configuration" : prefix, describe(item.first));
    const auto key = item.first.as<std::string>();
    const auto path = prefix.empty() ? key : prefix + "." + key;
    GA_CHECK(base[key].IsDefined(), "unknown key '{}'", path);
    if (base[key].IsMap()) {
      merge(base[key], item.second, path);
    } else {
      base[key] = item.second;
    }
  }
}

YAML::Node parse_yaml(const std::string& text, const std::string& what) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(fmt::format("{}: malformed YAML at line {}, column {}: {}", what, e.mark.line + 1,
                            e.mark.column + 1, e.msg));
  }
}

// Typed access that names the key on failure.
template <typename T>
T get(const YAML::Node& root, const std::string& path, const char* expected) {
  YAML::Node node = YAML::Clone(root);
  size_t begin = 0;
  while (true) {
    const auto dot = path.find('.', begin);
    node.reset(node[path.substr(begin, dot - begin)]);  // reset: operator= would assign through
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    throw Error(fmt::format("key '{}': expected {}, got {}", path, expected, describe(node)));
  }
}

int64_t get_int(const YAML::Node& root, const std::string& path) {
  return get<int64_t>(root, path, "an integer");
}
double get_double(const YAML::Node& root, const std::string& path) {
  return get<double>(root, path, "a number");
}
std::string get_string(const YAML::Node& root, const std::string& path) {
  return get<std::string>(root, path, "a string");
}
bool get_bool(const YAML::Node& root, const std::string& path) {
  return get<bool>(root, path, "true or false");
}

std::string one_of(const YAML::Node& root, const std::string& path,
                   const std::vector<std::string>& allowed) {
  auto value = get_string(root, path);
  for (const auto& a : allowed) {
    if (value == a) return value;
  }
  throw Error(fmt::format("key '{}': '{}' is not one of {}", path, value, fmt::join(allowed, " | ")));
}

void require(bool ok, const std::string& path, const std::string& rule, const std::string& got) {
  GA_CHECK(ok, "key '{}': must be {}, got {}", path, rule, got);
}

}  // namespace

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides,
                        int64_t world_size) {
  YAML::Node root = YAML::Load(default_config_yaml());
  if (!path.empty()) {
    GA_CHECK(std::filesystem::is_regular_file(path), "{}: no such configuration file", path);
    YAML::Node user;
    try {
      user = YAML::LoadFile(path);
    } catch (const YAML::Exception& e) {
      throw Error(fmt::format("{}: malformed YAML at line {}, column {}: {}", path, e.mark.line + 1,
                              e.mark.column + 1, e.msg));
    }
    if (!user.IsNull()) merge(root, user, "");
  }
  for (const auto& assignment : overrides) {
    const auto eq = assignment.find('=');
    GA_CHECK(eq != std::string::npos && eq > 0, "--set '{}': expected key=value", assignment);
    const auto key = assignment.substr(0, eq);
    // The key becomes YAML text below, so it must not carry YAML syntax of its own.
    for (size_t i = 0; i < key.size(); ++i) {
      const char ch = key[i];
      const bool name = std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
      const bool dot = ch == '.' && i > 0 && i + 1 < key.size() && key[i + 1] != '.';
      GA_CHECK(name || dot, "--set '{}': a key is names of letters, digits and '_' joined by '.'",
               key);
    }
    // Build {a: {b: value}} for "a.b=value" and merge it like a file.
    std::string yaml_text;
    std::string indent;
    size_t begin = 0;
    while (true) {
      const auto dot = key.find('.', begin);
      yaml_text += indent + key.substr(begin, dot - begin) + ":";
      if (dot == std::string::npos) break;
      yaml_text += "\n";
      indent += "  ";
      begin = dot + 1;
    }
    // "--set key=" (or key="" after the shell) means the empty string, not YAML's null.
    const auto text = assignment.substr(eq + 1);
    auto value = text.empty() ? YAML::Node(std::string()) : parse_yaml(text, fmt::format("--set {}", key));
    YAML::Node patch = parse_yaml(yaml_text, fmt::format("--set {}", key));
    YAML::Node leaf = patch;
    begin = 0;
    while (true) {
      const auto dot = key.find('.', begin);
      const auto part = key.substr(begin, dot - begin);
      if (dot == std::string::npos) {
        leaf[part] = value;
        break;
      }
      leaf.reset(leaf[part]);
      begin = dot + 1;
    }
    merge(root, patch, "");
  }

  TrainConfig c;
  c.output_dir = get_string(root, "output_dir");
  require(!c.output_dir.empty(), "output_dir", "a directory", "''");
  auto& t = c.trainer;
  t.seed = static_cast<uint64_t>(get_int(root, "seed"));
  c.threads = get_int(root, "threads");
  require(c.threads >= 0, "threads", ">= 0 (0 = all cores)", std::to_string(c.threads));
  c.dtype = one_of(root, "dtype", {"float32", "float64"});
  t.dtype = c.dtype == "float64" ? torch::kDouble : torch::kFloat;
  c.device = one_of(root, "device", {"cpu", "cuda"});
  t.device = c.device == "cuda" ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);

  c.model.type = one_of(root, "model.type", {"mlp", "cnn", "resnet", "gpt2", "bloom"});
  c.model.norm = one_of(root, "model.norm", {"batch", "group", "layer", "none"});
  c.model.norm_groups = get_int(root, "model.norm_groups");
  require(c.model.norm_groups >= 1, "model.norm_groups", ">= 1", std::to_string(c.model.norm_groups));
  c.model.channels = get<std::vector<int64_t>>(root, "model.channels", "a list of integers");
  c.model.hidden = get<std::vector<int64_t>>(root, "model.hidden", "a list of integers");
  for (const char* key : {"model.n_layer", "model.n_embd", "model.n_head", "model.n_positions"}) {
    require(get_int(root, key) >= 1, key, ">= 1", std::to_string(get_int(root, key)));
  }
  c.model.n_layer = get_int(root, "model.n_layer");
  c.model.n_embd = get_int(root, "model.n_embd");
  c.model.n_head = get_int(root, "model.n_head");
  c.model.n_positions = get_int(root, "model.n_positions");
  c.model.vocab_size = get_int(root, "model.vocab_size");
  require(c.model.vocab_size >= 0, "model.vocab_size", ">= 0 (0 = the tokenizer's)", std::to_string(c.model.vocab_size));
  c.model.hf_checkpoint = get_string(root, "model.hf_checkpoint");
  for (auto [key, value] : {std::pair{"model.resid_pdrop", &c.model.resid_pdrop}, std::pair{"model.embd_pdrop", &c.model.embd_pdrop},
                            std::pair{"model.attn_pdrop", &c.model.attn_pdrop}, std::pair{"model.hidden_dropout", &c.model.hidden_dropout},
                            std::pair{"model.attention_dropout", &c.model.attention_dropout}}) {
    *value = get_double(root, key);
    require(*value == -1 || (*value >= 0 && *value < 1), key, "in [0, 1), or -1 for the checkpoint's (else 0)",
            fmt::format("{}", *value));
  }
  c.model.dropout = get_double(root, "model.dropout");
  require(c.model.dropout >= 0 && c.model.dropout < 1, "model.dropout", "in [0, 1)", fmt::format("{}", c.model.dropout));
  c.model.dropout_rng = models::parse_dropout_rng(one_of(root, "model.dropout_rng", {"per_sample", "libtorch"}));

  c.data.type = one_of(root, "data.type", {"fashion_mnist", "kjv", "kjv_testament", "text", "random_tokens"});
  const bool text_data = c.data.type != "fashion_mnist";
  const bool language_model = c.model.type == "gpt2" || c.model.type == "bloom" || !c.model.hf_checkpoint.empty();
  GA_CHECK(text_data == language_model,
           "key 'data.type': {} data needs {} (model.type is {})", c.data.type,
           text_data ? "a language model: model.type gpt2 or bloom, or model.hf_checkpoint"
                     : "an image model: model.type mlp, cnn or resnet",
           c.model.type);
  c.data.directory = get_string(root, "data.directory");
  if (c.data.directory.empty()) c.data.directory = data::kFashionMnistDir;
  c.data.path = get_string(root, "data.path");
  GA_CHECK(c.data.type != "text" || !c.data.path.empty(), "key 'data.path': data.type text needs a file");
  c.data.eval_path = get_string(root, "data.eval_path");
  c.data.tokenizer = get_string(root, "data.tokenizer");
  c.data.max_length = get_int(root, "data.max_length");
  require(c.data.max_length >= 2, "data.max_length", ">= 2", std::to_string(c.data.max_length));
  c.data.packing = get_bool(root, "data.packing");
  t.group_by_length = get_bool(root, "data.group_by_length");
  c.data.eval_fraction = get_double(root, "data.eval_fraction");
  require(c.data.eval_fraction >= 0 && c.data.eval_fraction < 1, "data.eval_fraction", "in [0, 1)",
          fmt::format("{}", c.data.eval_fraction));
  c.data.balanced = get_bool(root, "data.balanced");
  const bool random_tokens = c.data.type == "random_tokens";
  c.data.vocab_size = get_int(root, "data.vocab_size");
  if (random_tokens) {
    require(c.data.vocab_size >= 2, "data.vocab_size", ">= 2 with data.type random_tokens",
            std::to_string(c.data.vocab_size));
  } else {
    require(c.data.vocab_size == 0, "data.vocab_size", "0 unless data.type is random_tokens (the tokenizer's)",
            std::to_string(c.data.vocab_size));
  }
  c.data.train_size = get_int(root, "data.train_size");
  require(c.data.train_size >= 1, "data.train_size", ">= 1", std::to_string(c.data.train_size));
  c.sample.prompt = get_string(root, "sample.prompt");
  GA_CHECK(!random_tokens || c.sample.prompt.empty(),
           "key 'sample.prompt': data.type random_tokens has no tokenizer to encode a prompt; leave it \"\"");
  c.sample.max_new_tokens = get_int(root, "sample.max_new_tokens");
  require(c.sample.max_new_tokens >= 0, "sample.max_new_tokens", ">= 0", std::to_string(c.sample.max_new_tokens));
  c.sample.temperature = get_double(root, "sample.temperature");
  require(c.sample.temperature >= 0, "sample.temperature", ">= 0 (0 = greedy)", fmt::format("{}", c.sample.temperature));
  c.sample.top_k = get_int(root, "sample.top_k");
  require(c.sample.top_k >= 0, "sample.top_k", ">= 0 (0 = all)", std::to_string(c.sample.top_k));
  c.data.train_limit = get_int(root, "data.train_limit");
  require(c.data.train_limit >= 0, "data.train_limit", ">= 0 (0 = all)", std::to_string(c.data.train_limit));
  c.data.eval_limit = get_int(root, "data.eval_limit");

  // `auto`: the decomposition of global_batch_size is planned at start-up (cli/plan_command.h).
  for (const char* key : {"per_device_train_batch_size", "gradient_accumulation_steps"}) {
    if (root[key] && root[key].IsScalar() && root[key].Scalar() == "auto") {
      c.plan_decomposition = true;
      root[key] = 1;
    }
  }
  if (c.plan_decomposition) {
    GA_CHECK(root["global_batch_size"] && root["global_batch_size"].IsScalar() &&
                 root["global_batch_size"].Scalar() != "0",
             "key 'per_device_train_batch_size': auto plans a decomposition of global_batch_size; set "
             "global_batch_size (> 0)");
    root["gradient_accumulation_steps"] = 1;
  }
  t.per_device_train_batch_size = get_int(root, "per_device_train_batch_size");
  require(t.per_device_train_batch_size >= 1, "per_device_train_batch_size", ">= 1 (or auto)",
          std::to_string(t.per_device_train_batch_size));
  t.per_device_eval_batch_size = get_int(root, "per_device_eval_batch_size");
  require(t.per_device_eval_batch_size >= 1, "per_device_eval_batch_size", ">= 1",
          std::to_string(t.per_device_eval_batch_size));
  t.gradient_accumulation_steps = get_int(root, "gradient_accumulation_steps");
  require(t.gradient_accumulation_steps >= 1, "gradient_accumulation_steps", ">= 1",
          std::to_string(t.gradient_accumulation_steps));
  t.global_batch_size = get_int(root, "global_batch_size");
  require(t.global_batch_size >= 0, "global_batch_size", ">= 0 (0 = b x N x world)",
          std::to_string(t.global_batch_size));
  t.num_train_epochs = get_int(root, "num_train_epochs");
  require(t.num_train_epochs >= 1, "num_train_epochs", ">= 1", std::to_string(t.num_train_epochs));
  t.max_steps = get_int(root, "max_steps");
  require(t.max_steps >= 0, "max_steps", ">= 0 (0 = use num_train_epochs)", std::to_string(t.max_steps));

  t.optimizer.type = one_of(root, "optim", {"adamw", "sgd"});
  t.optimizer.learning_rate = get_double(root, "learning_rate");
  require(t.optimizer.learning_rate >= 0, "learning_rate", ">= 0", fmt::format("{}", t.optimizer.learning_rate));
  t.optimizer.weight_decay = get_double(root, "weight_decay");
  require(t.optimizer.weight_decay >= 0, "weight_decay", ">= 0", fmt::format("{}", t.optimizer.weight_decay));
  t.optimizer.momentum = get_double(root, "momentum");
  require(t.optimizer.momentum >= 0 && t.optimizer.momentum < 1, "momentum", "in [0, 1)",
          fmt::format("{}", t.optimizer.momentum));
  t.optimizer.nesterov = get_bool(root, "nesterov");
  require(!t.optimizer.nesterov || t.optimizer.momentum > 0, "nesterov", "false unless momentum > 0", "true");
  t.optimizer.adam_beta1 = get_double(root, "adam_beta1");
  t.optimizer.adam_beta2 = get_double(root, "adam_beta2");
  for (const char* k : {"adam_beta1", "adam_beta2"}) {
    const double v = get_double(root, k);
    require(v >= 0 && v < 1, k, "in [0, 1)", fmt::format("{}", v));
  }
  t.optimizer.adam_epsilon = get_double(root, "adam_epsilon");
  require(t.optimizer.adam_epsilon > 0, "adam_epsilon", "> 0", fmt::format("{}", t.optimizer.adam_epsilon));

  t.lr_scheduler_type = optim::parse_schedule_type(one_of(root, "lr_scheduler_type", {"constant", "linear", "cosine"}));
  t.warmup_steps = get_int(root, "warmup_steps");
  require(t.warmup_steps >= 0, "warmup_steps", ">= 0", std::to_string(t.warmup_steps));
  t.warmup_ratio = get_double(root, "warmup_ratio");
  require(t.warmup_ratio >= 0 && t.warmup_ratio <= 1, "warmup_ratio", "in [0, 1]", fmt::format("{}", t.warmup_ratio));
  t.max_grad_norm = get_double(root, "max_grad_norm");
  require(t.max_grad_norm >= 0, "max_grad_norm", ">= 0 (0 disables clipping)", fmt::format("{}", t.max_grad_norm));

  c.mixed_precision = one_of(root, "mixed_precision", {"no", "bf16", "fp16"});
  t.mixed_precision = core::parse_mixed_precision(c.mixed_precision);
  require(t.mixed_precision == core::MixedPrecision::none || t.dtype == torch::kFloat,
          "mixed_precision", "\"no\" with dtype: float64 (mixed precision keeps float32 parameters)",
          c.mixed_precision);
  c.bf16_cpu_matmuls = one_of(root, "bf16_cpu_matmuls", {"auto", "float32", "libtorch"});
  c.custom_kernels = get_string(root, "custom_kernels");
  core::parse_custom_kernels(c.custom_kernels);  // names an unknown kernel
  c.model.gradient_checkpointing = get_bool(root, "gradient_checkpointing");
  c.model.loss_chunk_tokens = get_int(root, "loss_chunk_tokens");
  require(c.model.loss_chunk_tokens >= 0, "loss_chunk_tokens", ">= 0 (0 = automatic)",
          std::to_string(c.model.loss_chunk_tokens));
  auto& scaler = t.loss_scaler;
  scaler.init_scale = get_double(root, "loss_scaler.init_scale");
  require(scaler.init_scale > 0 && std::isfinite(static_cast<float>(scaler.init_scale)),
          "loss_scaler.init_scale", "> 0 and finite in float32", fmt::format("{}", scaler.init_scale));
  scaler.growth_factor = get_double(root, "loss_scaler.growth_factor");
  require(scaler.growth_factor > 1, "loss_scaler.growth_factor", "> 1", fmt::format("{}", scaler.growth_factor));
  scaler.backoff_factor = get_double(root, "loss_scaler.backoff_factor");
  require(scaler.backoff_factor > 0 && scaler.backoff_factor < 1, "loss_scaler.backoff_factor",
          "in (0, 1)", fmt::format("{}", scaler.backoff_factor));
  scaler.growth_interval = get_int(root, "loss_scaler.growth_interval");
  require(scaler.growth_interval >= 1, "loss_scaler.growth_interval", ">= 1",
          std::to_string(scaler.growth_interval));
  const auto normalization = one_of(root, "loss_normalization", {"window", "sum", "micro_batch"});
  t.loss_normalization = normalization == "window" ? core::LossNormalization::window
                         : normalization == "sum"  ? core::LossNormalization::sum
                                                   : core::LossNormalization::micro_batch;
  const auto last_window = one_of(root, "last_window", {"partial", "drop", "carry"});
  t.last_window = last_window == "partial" ? core::LastWindow::partial
                  : last_window == "drop"  ? core::LastWindow::drop
                                           : core::LastWindow::carry;
  const auto order = one_of(root, "train_sampling_strategy", {"random", "sequential", "longest_first"});
  t.sample_order = order == "random"       ? core::SampleOrder::random
                   : order == "sequential" ? core::SampleOrder::sequential
                                           : core::SampleOrder::longest_first;
  c.logging_steps = get_int(root, "logging_steps");
  require(c.logging_steps >= 1, "logging_steps", ">= 1", std::to_string(c.logging_steps));
  {
    // HF's report_to: a name or a list of names.
    const YAML::Node node = root["report_to"];
    std::vector<std::string> names;
    if (node.IsSequence()) {
      for (const auto& item : node) {
        GA_CHECK(item.IsScalar(), "key 'report_to': expected names, got {}", describe(item));
        names.push_back(item.Scalar());
      }
    } else {
      GA_CHECK(node.IsScalar(), "key 'report_to': expected a name or a list of names, got {}", describe(node));
      names.push_back(node.Scalar());
    }
    for (const auto& name : names) {
      GA_CHECK(name == "none" || name == "tensorboard", "key 'report_to': '{}' is not one of none | tensorboard",
               name);
      if (name == "tensorboard" &&
          std::find(c.report_to.begin(), c.report_to.end(), name) == c.report_to.end()) {
        c.report_to.push_back(name);
      }
    }
    GA_CHECK(c.report_to.empty() || std::find(names.begin(), names.end(), "none") == names.end(),
             "key 'report_to': 'none' cannot be combined with other names");
  }
  t.grad_flow_steps = get_int(root, "grad_flow_steps");
  require(t.grad_flow_steps >= -1, "grad_flow_steps", ">= 0, or -1 for logging_steps",
          std::to_string(t.grad_flow_steps));
  if (t.grad_flow_steps == -1) t.grad_flow_steps = c.logging_steps;
  c.logging_dir = get_string(root, "logging_dir");
  if (c.logging_dir.empty()) c.logging_dir = (std::filesystem::path(c.output_dir) / "runs").string();
  t.eval_steps = get_int(root, "eval_steps");
  require(t.eval_steps >= 0, "eval_steps", ">= 0 (0 = at the end only)", std::to_string(t.eval_steps));
  c.dist_timeout_s = get_int(root, "dist_timeout");
  require(c.dist_timeout_s >= 1, "dist_timeout", ">= 1 (seconds)", std::to_string(c.dist_timeout_s));
  c.ddp_bucket_cap_mb = get_int(root, "ddp_bucket_cap_mb");
  require(c.ddp_bucket_cap_mb >= 1, "ddp_bucket_cap_mb", ">= 1", std::to_string(c.ddp_bucket_cap_mb));
  c.sync_each_micro_step = get_bool(root, "sync_each_micro_step");
  c.zero_stage = get_int(root, "zero_stage");
  require(c.zero_stage == 0 || c.zero_stage == 1, "zero_stage", "0 or 1", std::to_string(c.zero_stage));
  t.deterministic_accumulation = get_bool(root, "deterministic_accumulation");
  t.oom_recovery = get_bool(root, "oom_recovery");
  t.max_tokens_per_micro_batch = get_int(root, "max_tokens_per_micro_batch");
  require(t.max_tokens_per_micro_batch >= 0, "max_tokens_per_micro_batch", ">= 0 (0 = b rows per micro-batch)",
          std::to_string(t.max_tokens_per_micro_batch));
  GA_CHECK(t.max_tokens_per_micro_batch == 0 || !t.deterministic_accumulation,
           "key 'max_tokens_per_micro_batch': cannot be combined with deterministic_accumulation (the number of "
           "micro-batches per rank would depend on the world size)");
  t.window_tokens = get_int(root, "window_tokens");
  require(t.window_tokens >= 0, "window_tokens", ">= 0 (0 = windows of b x N x W samples)",
          std::to_string(t.window_tokens));
  if (t.window_tokens > 0) {
    GA_CHECK(!t.deterministic_accumulation,
             "key 'window_tokens': cannot be combined with deterministic_accumulation (its tree needs the same "
             "number of micro-batches in every window)");
    GA_CHECK(t.last_window != core::LastWindow::carry, "key 'window_tokens': cannot be combined with last_window: carry");
    GA_CHECK(t.loss_normalization != core::LossNormalization::micro_batch,
             "key 'window_tokens': needs loss_normalization window or sum, not micro_batch (N varies per window)");
    GA_CHECK(!c.plan_decomposition && t.global_batch_size == 0,
             "key 'window_tokens': cannot be combined with global_batch_size (the windows are measured in tokens)");
  }
  if (t.deterministic_accumulation) {
    GA_CHECK(t.loss_normalization != core::LossNormalization::micro_batch,
             "key 'deterministic_accumulation': needs loss_normalization window or sum, not micro_batch");
    GA_CHECK(!c.sync_each_micro_step && c.zero_stage == 0,
             "key 'deterministic_accumulation': reduces across ranks in its own tree order; it cannot be "
             "combined with sync_each_micro_step or zero_stage: 1");
  }
  c.save_steps = get_int(root, "save_steps");
  require(c.save_steps >= 0, "save_steps", ">= 0 (0 = at the end only)", std::to_string(c.save_steps));
  t.save_steps = c.save_steps;
  c.save_total_limit = get_int(root, "save_total_limit");
  require(c.save_total_limit >= 0, "save_total_limit", ">= 0 (0 = keep all)", std::to_string(c.save_total_limit));
  c.resume_from_checkpoint = get_string(root, "resume_from_checkpoint");
  c.allow_batch_change = get_bool(root, "allow_batch_change");
  t.nan_policy = one_of(root, "nan_policy", {"abort", "skip"}) == "abort" ? core::NanPolicy::abort
                                                                          : core::NanPolicy::skip;

  // The GA arithmetic must hold before anything runs: this throws naming the numbers.
  const auto geometry = t.geometry(world_size);
  GA_CHECK(!t.deterministic_accumulation || (world_size & (world_size - 1)) == 0,
           "key 'deterministic_accumulation': the world size must be a power of two, not {}", world_size);
  root["gradient_accumulation_steps"] = geometry.accumulation_steps();
  t.gradient_accumulation_steps = geometry.accumulation_steps();

  YAML::Emitter out;
  out << root;
  c.resolved_yaml = std::string(out.c_str()) + "\n";
  return c;
}

}  // namespace gradaccum::io
