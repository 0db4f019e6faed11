#include "gradaccum/io/workload.h"

#include <stdlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "gradaccum/base/check.h"
#include "gradaccum/base/named_table.h"
#include "gradaccum/data/classification_dataset.h"
#include "gradaccum/data/data_split.h"
#include "gradaccum/data/fashion_mnist.h"
#include "gradaccum/data/gguf_tokenizer.h"
#include "gradaccum/data/kjv.h"
#include "gradaccum/data/lm_dataset.h"
#include "gradaccum/data/random_tokens.h"
#include "gradaccum/data/text_classification.h"
#include "gradaccum/data/text_source.h"
#include "gradaccum/models/architectures.h"
#include "gradaccum/models/gguf_checkpoint.h"
#include "gradaccum/models/lora.h"

namespace gradaccum::io {

namespace {

// `limit` samples spread evenly over a dataset: sample ⌊k·n/limit⌋ for k <
// limit. Text corpora are ordered (the KJV runs from Genesis to Revelation,
// so a prefix of the Testament task would hold Old Testament verses only).
class SpreadSubset final : public core::Dataset {
 public:
  SpreadSubset(std::shared_ptr<core::Dataset> inner, int64_t limit)
      : inner_(std::move(inner)),
        indices_(torch::div(torch::arange(limit, torch::kLong) * inner_->size(), limit, "floor")) {}
  int64_t size() const override { return indices_.size(0); }
  core::Batch get(const torch::Tensor& indices, torch::ScalarType dtype) const override {
    GA_CHECK(indices.numel() == 0 || (indices.min().item<int64_t>() >= 0 && indices.max().item<int64_t>() < size()),
             "subset: sample index out of range [0, {})", size());
    return inner_->get(indices_.index_select(0, indices), dtype);
  }
  torch::Tensor sample_lengths() const override {
    auto lengths = inner_->sample_lengths();
    return lengths.defined() ? lengths.index_select(0, indices_) : lengths;
  }
  torch::Tensor sample_items() const override {
    auto items = inner_->sample_items();
    return items.defined() ? items.index_select(0, indices_) : items;
  }

 private:
  std::shared_ptr<core::Dataset> inner_;
  torch::Tensor indices_;
};

std::shared_ptr<core::Dataset> limit(std::shared_ptr<core::Dataset> data, int64_t n) {
  if (data == nullptr || n <= 0 || n >= data->size()) return data;
  return std::make_shared<SpreadSubset>(std::move(data), n);
}

data::TokenId end_of_text(const data::Tokenizer& tokenizer) {
  const auto id = tokenizer.token_id("<|endoftext|>");
  GA_CHECK(id.has_value(), "tokenizer {}: it has no <|endoftext|> token to pad with", tokenizer.source());
  return *id;
}

// Text files: a causal LM for unlabelled documents, a classifier for labelled ones.
void make_text_data(const TrainConfig& config, const data::Tokenizer& tokenizer, Workload& w) {
  const auto& d = config.data;
  auto records = data::read_text_records(d.path);
  std::vector<data::TextRecord> eval_records;
  if (!d.eval_path.empty()) {
    eval_records = data::read_text_records(d.eval_path);
  } else if (d.eval_fraction > 0) {
    const auto split = data::interleaved_split(static_cast<int64_t>(records.size()), d.eval_fraction);
    std::vector<data::TextRecord> train;
    for (auto i : split.train) train.push_back(records[static_cast<size_t>(i)]);
    for (auto i : split.eval) eval_records.push_back(records[static_cast<size_t>(i)]);
    records = std::move(train);
  }
  const bool labelled = records.front().label >= 0;
  const auto pad = end_of_text(tokenizer);
  if (!labelled) {
    data::LmDatasetOptions options;
    options.max_length = d.max_length;
    options.packing = d.packing;
    options.pad_token_id = pad;
    options.eos_token_id = pad;
    auto train = std::make_shared<data::CausalLmDataset>(data::encode_records(tokenizer, records), options);
    w.description = train->summary();
    w.train = train;
    if (!eval_records.empty()) {
      w.eval = std::make_shared<data::CausalLmDataset>(data::encode_records(tokenizer, eval_records), options);
    }
    w.num_labels = 0;
    return;
  }
  // Labels are class indices 0..K-1, and K sizes the classifier's head and its id2label: a label
  // is checked against how many documents there are before anything of size K exists (a label of
  // 10^15 in a file of four lines is a broken file, not a 10^15-way classifier).
  const auto documents = static_cast<int64_t>(records.size() + eval_records.size());
  int64_t max_label = 0;
  for (const auto* set : {&records, &eval_records}) {
    const auto& file = set == &eval_records && !d.eval_path.empty() ? d.eval_path : d.path;
    for (const auto& r : *set) {
      GA_CHECK(r.label >= 0, "{}: every record needs a label once one has", file);
      GA_CHECK(r.label < documents,
               "{}: \"label\" {} is not a class index below the {} labelled documents (labels are 0 to K-1 for K "
               "classes)",
               file, r.label, documents);
      max_label = std::max(max_label, r.label);
    }
  }
  w.num_labels = max_label + 1;
  GA_CHECK(w.num_labels >= 2, "{}: every label is {}; classification needs at least two classes", d.path, max_label);
  data::ClassificationDatasetOptions options;
  options.max_length = d.max_length;
  options.pad_token_id = pad;
  options.num_labels = w.num_labels;
  auto to_examples = [&](const std::vector<data::TextRecord>& set) {
    std::vector<data::LabelledTokens> examples;
    for (const auto& r : set) examples.push_back({tokenizer.encode(r.text), r.label});
    return examples;
  };
  w.train = std::make_shared<data::SequenceClassificationDataset>(to_examples(records), options);
  if (!eval_records.empty()) {
    w.eval = std::make_shared<data::SequenceClassificationDataset>(to_examples(eval_records), options);
  }
  w.description = fmt::format("{}: {} labelled documents, {} labels", d.path, records.size(), w.num_labels);
}

// The loss of the best model that ignores context: the entropy of the
// training targets' token frequencies, in nats. A language model that has
// learned anything beats it; the log prints it beside the first losses.
double unigram_entropy(const core::Dataset& data, int64_t vocab) {
  auto counts = torch::zeros({vocab}, torch::kLong);
  for (int64_t begin = 0; begin < data.size(); begin += 4096) {
    const auto batch = data.get(torch::arange(begin, std::min(begin + 4096, data.size())), torch::kFloat);
    const auto labels = batch.target.slice(1, 1);  // what the shifted loss predicts
    counts += torch::bincount(labels.masked_select(labels != core::kIgnoreIndex), {}, vocab);
  }
  const auto p = counts.to(torch::kDouble) / counts.sum().clamp_min(1).to(torch::kDouble);
  return -(p * p.clamp_min(1e-300).log()).sum().item<double>();
}

}  // namespace

std::string tokenizer_directory(const std::string& configured) {
  if (!configured.empty()) return configured;
  const char* env = std::getenv("GRADACCUM_TOKENIZER_DIR");
  const std::string dir = env != nullptr && *env != '\0' ? env : data::kDefaultTokenizerDir;
  std::error_code ec;
  GA_CHECK(std::filesystem::exists(dir, ec),
           "tokenizer directory {} does not exist: run scripts/setup.sh, or pass --tokenizer DIR", dir);
  return dir;
}

namespace {

// Directories this process made under the system's temporary directory, removed at its exit.
class TemporaryDirectories {
 public:
  ~TemporaryDirectories() {
    std::error_code ec;
    for (const auto& dir : dirs_) std::filesystem::remove_all(dir, ec);
  }
  std::string make(const std::string& stem) {
    std::string pattern = (std::filesystem::temp_directory_path() / (stem + "-XXXXXX")).string();
    GA_CHECK(::mkdtemp(pattern.data()) != nullptr, "cannot create a temporary directory {}: {}", pattern,
             std::strerror(errno));
    const std::lock_guard<std::mutex> lock(mutex_);
    dirs_.push_back(pattern);
    return pattern;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> dirs_;
};

// A GGUF file's tokenizer as a tokenizer.json file (the one HF's loaders read beside a checkpoint),
// written into a temporary directory of this process: the 100 MB GGUF file is not copied.
std::string gguf_tokenizer_json_file(const std::string& gguf_path) {
  static TemporaryDirectories temporary;
  const auto path = temporary.make("gradaccum-tokenizer") + "/tokenizer.json";
  data::write_tokenizer_json(path, data::gguf_tokenizer_json(formats::GgufFile::open(gguf_path)));
  return path;
}

}  // namespace

std::vector<std::string> tokenizer_files(const data::Tokenizer& tokenizer) {
  // Tokenizer::source() is "path" (gpt2.tiktoken, tokenizer.json, a .gguf file) or "encoder.json path + vocab.bpe
  // path".
  std::vector<std::string> files;
  const std::string& source = tokenizer.source();
  if (std::filesystem::path(source).extension() == ".gguf") return {gguf_tokenizer_json_file(source)};
  const std::string separator = " + ";
  size_t begin = 0;
  for (size_t at; (at = source.find(separator, begin)) != std::string::npos; begin = at + separator.size()) {
    files.push_back(source.substr(begin, at - begin));
  }
  files.push_back(source.substr(begin));
  return files;
}

namespace {
// gradient_checkpointing and loss_chunk_tokens (errors name the key when the
// model has nothing to apply them to).
void apply_memory_options(models::BuiltModel& model, const models::ModelConfig& config) {
  model.set_gradient_checkpointing(config.gradient_checkpointing);
  model.set_loss_chunk_tokens(config.loss_chunk_tokens);
}

// The `lora:` section's adapters (models/lora.h), when it names target modules; the base is
// model.hf_checkpoint (base_model_name_or_path) or the freshly drawn model.
void apply_lora(models::BuiltModel& model, const TrainConfig& config) {
  const auto& lora = config.lora;
  if (!lora.enabled()) {
    GA_CHECK(lora.modules_to_save.empty(), "key 'lora.modules_to_save': needs lora.target_modules (no LoRA without)");
    GA_CHECK(lora.base_dtype == torch::kFloat, "key 'lora.base_dtype': needs lora.target_modules (no LoRA without)");
    return;
  }
  GA_CHECK(lora.base_dtype == torch::kFloat || config.trainer.dtype == torch::kFloat,
           "key 'lora.base_dtype': {} beside dtype float64 (a bfloat16 base goes with dtype float32)",
           models::lora_base_dtype_names().name(lora.base_dtype));
  const auto& base = config.model.hf_checkpoint;
  models::attach_lora(model, lora, config.trainer.seed, config.model.dropout_rng,
                      base.empty() ? std::string() : std::filesystem::absolute(base).lexically_normal().string());
  if (!lora.init_from.empty()) models::init_lora_from_adapter(model, lora.init_from, "key 'lora.init_from'");
}

// data.type random_tokens: no tokenizer, the vocabulary is data.vocab_size.
// Evaluation (eval_fraction > 0) runs on ⌊train_size·eval_fraction⌋ further
// rows of the same seeded stream, disjoint from the training rows.
void load_random_tokens(const TrainConfig& config, bool with_eval, Workload& w) {
  const auto& d = config.data;
  const auto eval_rows =
      with_eval && d.eval_limit >= 0 ? static_cast<int64_t>(static_cast<double>(d.train_size) * d.eval_fraction) : 0;
  auto random = data::make_random_tokens_data(d.vocab_size, d.max_length, d.train_size, eval_rows, config.trainer.seed);
  w.description = random.train->summary();
  w.train = random.train;
  w.eval = random.eval;
}

// data.tokenizer, else a GGUF checkpoint's own tokenizer, else the default.
void load_tokenizer(const TrainConfig& config, Workload& w) {
  const auto& checkpoint = config.model.hf_checkpoint;
  const bool gguf_tokenizer = config.data.tokenizer.empty() && models::is_gguf_path(checkpoint);
  w.tokenizer.emplace(data::Tokenizer::load(gguf_tokenizer ? checkpoint : tokenizer_directory(config.data.tokenizer)));
}

void load_kjv(const TrainConfig& config, bool /*with_eval*/, Workload& w) {
  const auto& d = config.data;
  load_tokenizer(config, w);
  data::KjvLmOptions options;
  options.dataset.max_length = d.max_length;
  options.dataset.packing = d.packing;
  options.eval_fraction = d.eval_fraction;
  auto lm = data::make_kjv_lm_data(*w.tokenizer, options);
  w.description = "KJV verses: " + lm.train->summary();
  w.train = lm.train;
  w.eval = lm.eval;
}

void load_kjv_testament(const TrainConfig& config, bool /*with_eval*/, Workload& w) {
  const auto& d = config.data;
  load_tokenizer(config, w);
  data::KjvTestamentOptions options;
  options.max_length = d.max_length;
  options.eval_fraction = d.eval_fraction;
  options.balanced = d.balanced;
  options.seed = config.trainer.seed;
  auto cls = data::make_kjv_testament_data(*w.tokenizer, options);
  w.description = fmt::format("KJV Old (0) vs New (1) Testament: {} training verses, {} eval verses{}",
                              cls.train->size(), cls.eval ? cls.eval->size() : 0, d.balanced ? " (balanced)" : "");
  w.train = cls.train;
  w.eval = cls.eval;
  w.num_labels = 2;
}

void load_text(const TrainConfig& config, bool /*with_eval*/, Workload& w) {
  load_tokenizer(config, w);
  make_text_data(config, *w.tokenizer, w);
}

// data.type text_classification: labelled texts of JSON lines, CSV or TSV (data/text_classification.h).
void load_text_classification(const TrainConfig& config, bool /*with_eval*/, Workload& w) {
  const auto& d = config.data;
  GA_CHECK(!d.path.empty(), "key 'data.path': data.type text_classification needs a file");
  GA_CHECK(!d.eval_path.empty() || d.eval_fraction + d.test_fraction < 1,
           "keys 'data.eval_fraction' and 'data.test_fraction': {} + {} leave nothing to train on (their sum must be "
           "below 1)",
           d.eval_fraction, d.test_fraction);
  load_tokenizer(config, w);
  data::TextClassificationOptions options;
  options.path = d.path;
  options.eval_path = d.eval_path;
  options.fields.format = d.format;
  options.fields.text_field = d.text_field;
  options.fields.label_field = d.label_field;
  options.fields.header = d.header;
  options.labels = d.labels;
  options.eval_fraction = d.eval_fraction;
  options.test_fraction = d.test_fraction;
  options.seed = config.trainer.seed;
  options.dataset.max_length = d.max_length;
  options.dataset.pad_token_id = end_of_text(*w.tokenizer);
  auto cls = data::make_text_classification_data(*w.tokenizer, options);
  w.train = cls.train;
  w.eval = cls.eval;
  w.test = cls.test;
  w.num_labels = cls.num_labels;
  w.label_names = cls.label_names;
  w.description = cls.description;
}

void load_fashion_mnist(const TrainConfig& config, bool with_eval, Workload& w) {
  const auto& d = config.data;
  w.train = std::make_shared<data::FashionMnist>(d.directory, "train", d.train_limit);
  if (with_eval && d.eval_limit >= 0) w.eval = std::make_shared<data::FashionMnist>(d.directory, "test", d.eval_limit);
  w.description = fmt::format("Fashion-MNIST: {} training images", w.train->size());
  w.num_labels = 10;
}
}  // namespace

const std::vector<DataType>& data_types() {
  using models::ModelFamily;
  static const std::vector<DataType> types{
      {"fashion_mnist", ModelFamily::image, "Fashion-MNIST's 28×28 images, 10 classes (data.directory)",
       load_fashion_mnist},
      {"kjv", ModelFamily::language, "the King James Bible's verses for a causal LM (Debian's bible-kjv-text)",
       load_kjv},
      {"kjv_testament", ModelFamily::language, "KJV verses labelled Old (0) or New (1) Testament: classification",
       load_kjv_testament},
      {"text", ModelFamily::language,
       "data.path: .txt (a document per line) or .jsonl ({\"text\"}, optional \"label\": classification)", load_text},
      {"text_classification", ModelFamily::language,
       "labelled texts of JSON lines, CSV or TSV (data.path; data.eval_path, or data.eval_fraction and "
       "data.test_fraction: a seeded stratified split); data.text_field, data.label_field, data.labels",
       load_text_classification},
      {"random_tokens", ModelFamily::language, "seeded uniform ids in [0, data.vocab_size): no tokenizer",
       load_random_tokens},
  };
  return types;
}

const DataType& data_type(const std::string& name) { return base::find_named(data_types(), name, "data.type"); }

Workload make_workload(const TrainConfig& config, bool with_eval) {
  Workload w;
  const auto& d = config.data;
  const auto& type = data_type(d.type);
  type.load(config, with_eval, w);
  w.train = limit(w.train, d.train_limit);
  w.eval = with_eval && d.eval_limit >= 0 ? limit(w.eval, d.eval_limit) : nullptr;
  if (!with_eval || d.eval_limit < 0) w.test = nullptr;  // eval_limit < 0: no evaluation at all
  GA_CHECK(w.train->size() > 0, "data: no training samples ({})", w.description);
  GA_CHECK(!config.trainer.group_by_length || w.train->sample_lengths().defined(),
           "key 'data.group_by_length': the samples of data.type {} have no length to group by", d.type);
  if (type.family == models::ModelFamily::image) {
    models::ModelInputs inputs;
    inputs.classes = w.num_labels;
    w.model = models::make_model(config.model, inputs);
    apply_lora(w.model, config);
    apply_memory_options(w.model, config.model);
    return w;
  }

  // The ids the data can hold: the model's vocabulary must cover them.
  const int64_t vocab = w.tokenizer ? static_cast<int64_t>(w.tokenizer->id_count()) : d.vocab_size;
  const char* vocab_source = w.tokenizer ? "the tokenizer" : "data.vocab_size";
  if (config.model.hf_checkpoint.empty()) {
    models::ModelInputs inputs;
    inputs.vocab_size = vocab;
    inputs.num_labels = w.num_labels;
    inputs.init_seed = config.trainer.seed;
    w.model = models::make_model(config.model, inputs);
  } else {
    w.model = models::load_language_model(config.model.hf_checkpoint, w.num_labels, config.trainer.seed, &config.model);
    // The checkpoint says what it is; a model.type naming another architecture contradicts it (the default, an
    // image network's type, is no claim about a language model).
    GA_CHECK(
        models::find_decoder_architecture(config.model.type) == nullptr || config.model.type == w.model.architecture,
        "key 'model.type': {} contradicts model.hf_checkpoint {}, a {} checkpoint (leave model.type out: the "
        "checkpoint's is used)",
        config.model.type, config.model.hf_checkpoint, w.model.architecture);
  }
  apply_lora(w.model, config);
  apply_memory_options(w.model, config.model);
  GA_CHECK(w.model.vocab_size >= vocab, "model: its vocabulary has {} ids, {} {}: they do not fit", w.model.vocab_size,
           vocab_source, vocab);
  GA_CHECK(w.model.max_positions == 0 || d.max_length <= w.model.max_positions,
           "key 'data.max_length': {} is longer than the model's context of {} positions (n_positions)", d.max_length,
           w.model.max_positions);
  w.items_are_tokens = w.num_labels == 0;
  if (w.num_labels > 0) {
    // HF's *ForSequenceClassification finds each row's last real token from
    // pad_token_id; ours come from the attention mask, theirs need the id.
    w.model.hf_config["pad_token_id"] = end_of_text(*w.tokenizer);
    if (!w.label_names.empty()) {
      // Named classes: config.json says which is which, as HF's run_classification.py writes them.
      nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
      for (std::size_t i = 0; i < w.label_names.size(); ++i) {
        id2label[std::to_string(i)] = w.label_names[i];
        label2id[w.label_names[i]] = i;
      }
      w.model.hf_config["id2label"] = id2label;
      w.model.hf_config["label2id"] = label2id;
    }
  }
  if (w.items_are_tokens) {
    w.description += fmt::format("; unigram baseline {:.3f} nats/token", unigram_entropy(*w.train, vocab));
  }
  return w;
}

}  // namespace gradaccum::io
