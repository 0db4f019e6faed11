#include "gradaccum/models/lora.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "gradaccum/base/check.h"
#include "gradaccum/formats/safetensors.h"
#include "gradaccum/models/architectures.h"
#include "gradaccum/models/gguf_checkpoint.h"
#include "gradaccum/models/hf_checkpoint.h"
#include "gradaccum/models/sequence_classifier.h"

namespace gradaccum::models {

namespace fs = std::filesystem;

namespace {

// PEFT's saved names: the wrapper's `base_model.model.` before the model's own.
const std::string kPeftPrefix = "base_model.model.";
const char* kAdapterConfig = "adapter_config.json";
const char* kAdapterWeights = "adapter_model.safetensors";
// The adapters' dropout sites follow the decoders' (3 per layer, sample_dropout.h) far behind them.
constexpr int64_t kFirstAdapterSite = int64_t{1} << 20;

bool path_ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
bool name_starts_with(const std::string& s, const std::string& head) { return s.compare(0, head.size(), head) == 0; }

// PEFT's rule: a name matches a module whose path is it or ends with "." + it.
bool peft_name_matches(const std::string& path, const std::string& name) {
  return path == name || path_ends_with(path, "." + name);
}

std::string module_leaf(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

// The key a setting is named by in errors: "lora.r" for the configuration, the file's own key
// for an adapter_config.json.
std::string lora_key(const std::string& what, const std::string& config_key, const std::string& peft_key) {
  return what == "lora" ? fmt::format("key 'lora.{}'", config_key) : fmt::format("{}: \"{}\"", what, peft_key);
}

// The decoder's Linear layers: the adapters' candidates. The heads (lm_head, score) run outside
// models::linear and are trained whole through modules_to_save instead.
std::vector<std::pair<std::string, std::shared_ptr<torch::nn::LinearImpl>>> adaptable_linears(
    torch::nn::Module& module) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::LinearImpl>>> out;
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    if (!name_starts_with(item.key(), "transformer.")) continue;
    if (auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(item.value()))
      out.emplace_back(item.key(), linear);
  }
  return out;
}

std::string comma_listed(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The task again around the same module, so that its dropout sites (found once, when a task is
// built) include the adapters'.
void rebuild_task_around_module(BuiltModel& model) {
  if (auto* lm = dynamic_cast<CausalLm*>(model.task.get())) {
    auto rebuilt = std::make_unique<CausalLm>(lm->model(), lm->loss_chunk_tokens());
    model.task = std::move(rebuilt);
  } else if (auto* classifier = dynamic_cast<SequenceClassifier*>(model.task.get())) {
    auto rebuilt = std::make_unique<SequenceClassifier>(classifier->model());
    model.task = std::move(rebuilt);
  }
}

// Whether module parameter `name` belongs to an adapter or a module to save.
bool is_trained(const LoraAdapters& adapters, const std::string& name) {
  for (const auto& path : adapters.adapted) {
    if (name_starts_with(name, path + ".lora_A.") || name_starts_with(name, path + ".lora_B.")) return true;
  }
  for (const auto& path : adapters.saved) {
    if (name_starts_with(name, path + ".")) return true;
  }
  return false;
}

std::vector<std::string> module_name_list(const nlohmann::json& config, const char* key, const std::string& what) {
  std::vector<std::string> out;
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return out;
  GA_CHECK(it->is_array(), "{}: \"{}\" must be a list of module names, got {}", what, key, it->dump());
  for (const auto& item : *it) {
    GA_CHECK(item.is_string(), "{}: \"{}\" must be a list of module names, got {}", what, key, it->dump());
    if (std::find(out.begin(), out.end(), item.get<std::string>()) == out.end()) out.push_back(item.get<std::string>());
  }
  return out;
}

}  // namespace

double LoraConfig::scaling() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

LoraAdapterImpl::LoraAdapterImpl(torch::nn::Linear lora_A, torch::nn::Linear lora_B, double scaling, double dropout,
                                 int64_t site, DropoutRng rng)
    : lora_A(std::move(lora_A)), lora_B(std::move(lora_B)), scaling(scaling) {
  this->dropout = register_module("dropout", SampleDropout(dropout, site, rng));
}

torch::Tensor LoraAdapterImpl::forward(const torch::Tensor& x) {
  // PEFT's order: lora_B(lora_A(dropout(x))) * scaling, in the adapter's dtype.
  const auto& a = lora_A->weight;
  const auto in = x.scalar_type() == a.scalar_type() ? x : x.to(a.scalar_type());
  const auto y = at::linear(at::linear(dropout->forward(in), a), lora_B->weight) * scaling;
  return y.scalar_type() == x.scalar_type() ? y : y.to(x.scalar_type());
}

LoraAdapterImpl* lora_adapter_of(const torch::nn::LinearImpl& layer) {
  for (const auto& child : layer.children()) {
    if (auto* adapter = dynamic_cast<LoraAdapterImpl*>(child.get())) return adapter;
  }
  return nullptr;
}

const base::EnumNames<torch::ScalarType>& lora_base_dtype_names() {
  static const base::EnumNames<torch::ScalarType> names{{torch::kFloat, "float32"}, {torch::kBFloat16, "bfloat16"}};
  return names;
}

void attach_lora(BuiltModel& model, const LoraConfig& config, uint64_t init_seed, DropoutRng dropout_rng,
                 const std::string& base, const std::string& what) {
  GA_CHECK(model.is_language_model(), "{}: LoRA adapters need a language model, not an image network",
           lora_key(what, "target_modules", "target_modules"));
  GA_CHECK(model.lora == nullptr, "{}: the model has adapters already", what);
  GA_CHECK(config.r > 0, "{}: must be > 0, got {}", lora_key(what, "r", "r"), config.r);
  GA_CHECK(config.alpha > 0 && std::isfinite(config.alpha), "{}: must be > 0, got {}",
           lora_key(what, "alpha", "lora_alpha"), config.alpha);
  GA_CHECK(config.dropout >= 0 && config.dropout < 1, "{}: must be in [0, 1), got {}",
           lora_key(what, "dropout", "lora_dropout"), config.dropout);
  GA_CHECK(config.enabled(), "{}: no module to adapt", lora_key(what, "target_modules", "target_modules"));
  GA_CHECK(config.base_dtype == torch::kFloat || config.base_dtype == torch::kBFloat16,
           "{}: must be float32 or bfloat16, got {}", lora_key(what, "base_dtype", "base_dtype"),
           c10::toString(config.base_dtype));
  const auto* architecture = find_decoder_architecture(model.architecture);
  GA_CHECK(architecture != nullptr, "{}: unknown architecture '{}'", what, model.architecture);
  auto& module = model.task->module();

  auto adapters = std::make_shared<LoraAdapters>();
  adapters->config = config;
  adapters->architecture = model.architecture;
  adapters->num_labels = model.num_labels;
  adapters->base = base;
  // A classifier's head starts fresh: PEFT's SEQ_CLS task trains it whole, and so does this.
  if (model.num_labels > 0 &&
      std::find(adapters->config.modules_to_save.begin(), adapters->config.modules_to_save.end(), "score") ==
          adapters->config.modules_to_save.end()) {
    adapters->config.modules_to_save.push_back("score");
  }

  // Targets: the decoder's Linear layers whose HF path a name matches; every name matches one.
  const auto linears = adaptable_linears(module);
  std::vector<std::string> linear_names;
  for (const auto& [path, layer] : linears) {
    const auto name = module_leaf(path);
    if (std::find(linear_names.begin(), linear_names.end(), name) == linear_names.end()) linear_names.push_back(name);
  }
  std::set<std::string> targeted;
  for (const auto& name : config.target_modules) {
    bool found = false;
    for (const auto& [path, layer] : linears) {
      if (peft_name_matches(hf_name_of(model.architecture, path), name)) {
        targeted.insert(path);
        found = true;
      }
    }
    GA_CHECK(found, "{}: '{}' matches none of the {} model's Linear layers ({})",
             lora_key(what, "target_modules", "target_modules"), name, architecture->display,
             comma_listed(linear_names));
  }
  // Modules to save: any module but the root and the adapted layers' insides.
  for (const auto& name : adapters->config.modules_to_save) {
    bool found = false;
    for (const auto& item : module.named_modules("", /*include_self=*/false)) {
      if (!peft_name_matches(hf_name_of(model.architecture, item.key()), name)) continue;
      GA_CHECK(targeted.count(item.key()) == 0, "{}: '{}' is both adapted and trained whole ({})",
               lora_key(what, "modules_to_save", "modules_to_save"), name, item.key());
      if (std::find(adapters->saved.begin(), adapters->saved.end(), item.key()) == adapters->saved.end()) {
        adapters->saved.push_back(item.key());
      }
      found = true;
    }
    // PEFT's SEQ_CLS task lists "classifier" and "score" whatever the model has, and PEFT skips a
    // name that matches nothing: so does an adapter_config.json here, not the configuration.
    GA_CHECK(found || what != "lora", "{}: '{}' matches no module of the {} model",
             lora_key(what, "modules_to_save", "modules_to_save"), name, architecture->display);
  }

  // A: Kaiming-uniform with a = √5 over fan_in = in, i.e. uniform in ±1/√in; B: zeros.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(init_seed);
  int64_t site = kFirstAdapterSite;
  torch::NoGradGuard no_grad;
  for (const auto& [path, layer] : linears) {
    if (targeted.count(path) == 0) continue;
    const auto& weight = layer->weight;
    const int64_t in = weight.size(1), out = weight.size(0);
    torch::nn::Linear a(torch::nn::LinearOptions(in, config.r).bias(false));
    torch::nn::Linear b(torch::nn::LinearOptions(config.r, out).bias(false));
    a->to(weight.device(), weight.scalar_type());
    b->to(weight.device(), weight.scalar_type());
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    a->weight.copy_(torch::empty({config.r, in}, torch::kDouble).uniform_(-bound, bound, generator));
    b->weight.zero_();
    layer->register_module("lora_A", a);
    layer->register_module("lora_B", b);
    layer->register_module("lora", LoraAdapter(a, b, config.scaling(), config.dropout, site++, dropout_rng));
    adapters->adapted.push_back(path);
  }
  for (auto& item : module.named_parameters()) item.value().requires_grad_(is_trained(*adapters, item.key()));
  if (config.base_dtype == torch::kBFloat16) {
    // The frozen Linear weights in 16 bits (linear.h multiplies them so); the engine keeps a
    // frozen 16-bit parameter's dtype when it places the model.
    for (const auto& [path, layer] : linears) {
      if (!layer->weight.requires_grad()) layer->weight.set_data(layer->weight.to(torch::kBFloat16));
    }
  }
  model.lora = adapters;
  rebuild_task_around_module(model);
}

nlohmann::json peft_adapter_config(const LoraAdapters& adapters) {
  const auto& c = adapters.config;
  return {{"peft_type", "LORA"},
          {"task_type", adapters.num_labels > 0 ? "SEQ_CLS" : "CAUSAL_LM"},
          {"base_model_name_or_path", adapters.base.empty() ? nlohmann::json(nullptr) : nlohmann::json(adapters.base)},
          {"r", c.r},
          {"lora_alpha", c.alpha},
          {"lora_dropout", c.dropout},
          {"target_modules", c.target_modules},
          {"use_rslora", c.use_rslora},
          {"modules_to_save", c.modules_to_save.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.modules_to_save)},
          {"bias", "none"},
          // GPT-2's Conv1D stores its weight [in, out]: PEFT's flag for such layers (the adapters
          // are [r, in] and [out, r] all the same).
          {"fan_in_fan_out", adapters.architecture == "gpt2"},
          {"init_lora_weights", true},
          {"inference_mode", true}};
}

LoraConfig lora_config_from_peft(const nlohmann::json& config, const std::string& what) {
  GA_CHECK(config.is_object(), "{}: not a JSON object", what);
  const auto type = config.value("peft_type", nlohmann::json(nullptr));
  GA_CHECK(type == "LORA", "{}: \"peft_type\" is {}; only LORA adapters load", what, type.dump());
  LoraConfig c;
  auto number = [&](const char* key, double fallback) {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) return fallback;
    GA_CHECK(it->is_number(), "{}: \"{}\" must be a number, got {}", what, key, it->dump());
    return it->get<double>();
  };
  const auto r = config.find("r");
  if (r != config.end()) {
    GA_CHECK(r->is_number_integer(), "{}: \"r\" must be an integer, got {}", what, r->dump());
    c.r = r->get<int64_t>();
  }
  c.alpha = number("lora_alpha", 8.0);  // PEFT's defaults
  c.dropout = number("lora_dropout", 0.0);
  const auto targets = config.find("target_modules");
  GA_CHECK(targets != config.end() && !targets->is_string(), "{}: \"target_modules\" must be a list of module names{}",
           what, targets == config.end() ? " (it has none)" : ", not a regular expression");
  c.target_modules = module_name_list(config, "target_modules", what);
  c.modules_to_save = module_name_list(config, "modules_to_save", what);
  if (const auto it = config.find("use_rslora"); it != config.end() && !it->is_null()) {
    GA_CHECK(it->is_boolean(), "{}: \"use_rslora\" must be true or false, got {}", what, it->dump());
    c.use_rslora = it->get<bool>();
  }
  const auto bias = config.value("bias", nlohmann::json("none"));
  GA_CHECK(bias == "none", "{}: \"bias\" is {}; only \"none\" is supported", what, bias.dump());
  const auto dora = config.find("use_dora");
  GA_CHECK(dora == config.end() || dora->is_null() || *dora == false,
           "{}: \"use_dora\" is {}; DoRA adapters are not supported", what, dora->dump());
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    const auto it = config.find(key);
    GA_CHECK(it == config.end() || it->is_null() || it->empty(),
             "{}: \"{}\" is {}; per-layer ranks and alphas are not supported", what, key, it->dump());
  }
  for (const char* key : {"layers_to_transform", "target_parameters", "trainable_token_indices"}) {
    const auto it = config.find(key);
    GA_CHECK(it == config.end() || it->is_null() || (it->is_array() && it->empty()), "{}: \"{}\" is {}; not supported",
             what, key, it->dump());
  }
  return c;
}

WeightList peft_adapter_tensors(BuiltModel& model) {
  GA_CHECK(model.lora != nullptr, "the model has no adapters");
  const auto& adapters = *model.lora;
  auto tensors = hf_tensors(model.task->module(), model.architecture,
                            [&](const std::string& name, const torch::Tensor&) { return is_trained(adapters, name); });
  for (auto& [name, tensor] : tensors) name = kPeftPrefix + name;
  return tensors;
}

void load_peft_adapter_tensors(BuiltModel& model, const WeightList& tensors, const std::string& what) {
  GA_CHECK(model.lora != nullptr, "{}: the model has no adapters to load it into", what);
  WeightList stripped;
  for (const auto& [name, tensor] : tensors) {
    GA_CHECK(name_starts_with(name, kPeftPrefix), "{}: tensor {} is not an adapter's (PEFT's names start with {})",
             what, name, kPeftPrefix);
    stripped.emplace_back(name.substr(kPeftPrefix.size()), tensor);
  }
  // The frozen base is not in an adapter's file; everything trained must be.
  std::vector<std::string> frozen;
  for (const auto& item : model.task->module().named_parameters()) {
    if (!is_trained(*model.lora, item.key())) frozen.push_back(item.key());
  }
  load_hf_tensors(model.task->module(), stripped, model.architecture, what, frozen);
}

void init_lora_from_adapter(BuiltModel& model, const std::string& adapter_dir, const std::string& what) {
  GA_CHECK(model.lora != nullptr, "{}: the model has no adapters to start from {}", what, adapter_dir);
  const fs::path dir(adapter_dir);
  const auto config_path = (dir / kAdapterConfig).string();
  GA_CHECK(fs::exists(config_path), "{}: {} has no {} (not a PEFT adapter directory)", what, adapter_dir,
           kAdapterConfig);
  const auto saved = lora_config_from_peft(read_json_file(config_path), config_path);
  const auto& ours = model.lora->config;
  const auto sorted = [](std::vector<std::string> names) {
    std::sort(names.begin(), names.end());
    return names;
  };
  const auto disagree = [&](const char* key, const std::string& theirs, const std::string& mine) {
    GA_CHECK(theirs == mine, "{}: {} has {} {}, the lora section {}", what, config_path, key, theirs, mine);
  };
  disagree("r", std::to_string(saved.r), std::to_string(ours.r));
  disagree("lora_alpha", fmt::format("{}", saved.alpha), fmt::format("{}", ours.alpha));
  disagree("use_rslora", saved.use_rslora ? "true" : "false", ours.use_rslora ? "true" : "false");
  disagree("target_modules", fmt::format("[{}]", fmt::join(sorted(saved.target_modules), ", ")),
           fmt::format("[{}]", fmt::join(sorted(ours.target_modules), ", ")));
  // modules_to_save are checked by their tensors: each trained module must be in the file, and
  // nothing else (a classifier's score is there whether or not the section names it).
  const auto weights_path = (dir / kAdapterWeights).string();
  GA_CHECK(fs::exists(weights_path), "{}: {} has no {}", what, adapter_dir, kAdapterWeights);
  load_peft_adapter_tensors(model, formats::load_safetensors(weights_path), weights_path);
}

bool is_adapter_directory(const std::string& dir) { return fs::exists(fs::path(dir) / kAdapterConfig); }

BuiltModel load_language_model_with_adapter(const std::string& adapter_dir, const std::string& base) {
  const fs::path dir(adapter_dir);
  const auto config_path = (dir / kAdapterConfig).string();
  GA_CHECK(fs::exists(config_path), "{}: no {} (not a PEFT adapter directory)", adapter_dir, kAdapterConfig);
  const auto config = read_json_file(config_path);
  const auto lora = lora_config_from_peft(config, config_path);
  std::string base_dir = base;
  if (base_dir.empty()) {
    if (fs::exists(dir / "config.json")) {
      base_dir = adapter_dir;
    } else {
      const auto named = config.value("base_model_name_or_path", nlohmann::json(nullptr));
      GA_CHECK(named.is_string() && !named.get<std::string>().empty(),
               "{}: names no base_model_name_or_path; pass the base model with --base DIR|FILE.gguf", config_path);
      base_dir = named.get<std::string>();
    }
  }
  // An HF checkpoint's directory, or a GGUF file (the adapter of a run that started from one names it).
  GA_CHECK(fs::is_directory(base_dir) || (is_gguf_path(base_dir) && fs::is_regular_file(base_dir)),
           "{}: the base model {} is neither a directory nor a GGUF file (pass it with --base DIR|FILE.gguf)",
           config_path, base_dir);
  const auto weights_path = (dir / kAdapterWeights).string();
  GA_CHECK(fs::exists(weights_path), "{}: no {}", adapter_dir, kAdapterWeights);
  const auto tensors = formats::load_safetensors(weights_path);
  const auto task = config.value("task_type", nlohmann::json(nullptr));
  // A classifier's adapter sizes its head by the score it saved.
  int64_t labels = -1;
  if (task == "SEQ_CLS") {
    for (const auto& [name, tensor] : tensors) {
      if (path_ends_with(name, ".score.weight") && tensor.dim() == 2) labels = tensor.size(0);
    }
  }
  auto model = load_language_model(base_dir, labels, 0);
  attach_lora(model, lora, 0, DropoutRng::per_sample, base_dir, config_path);
  load_peft_adapter_tensors(model, tensors, weights_path);
  return model;
}

void merge_lora(BuiltModel& model) {
  GA_CHECK(model.lora != nullptr, "the model has no adapters to merge");
  auto& module = model.task->module();
  std::map<std::string, std::shared_ptr<torch::nn::LinearImpl>> layers;
  for (const auto& [path, layer] : adaptable_linears(module)) layers.emplace(path, layer);
  torch::NoGradGuard no_grad;
  for (const auto& path : model.lora->adapted) {
    auto& layer = layers.at(path);
    auto* adapter = lora_adapter_of(*layer);
    GA_CHECK(adapter != nullptr, "{}: has no adapter to merge", path);
    const auto delta =
        torch::mm(adapter->lora_B->weight.to(torch::kDouble), adapter->lora_A->weight.to(torch::kDouble)) *
        adapter->scaling;
    layer->weight.copy_(layer->weight.to(torch::kDouble) + delta);
    for (const char* child : {"lora", "lora_A", "lora_B"}) layer->unregister_module(child);
  }
  for (auto& p : module.parameters()) p.requires_grad_(true);
  model.lora = nullptr;
  rebuild_task_around_module(model);
}

}  // namespace gradaccum::models
