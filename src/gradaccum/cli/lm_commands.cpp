#include "gradaccum/cli/lm_commands.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "gradaccum/base/check.h"
#include "gradaccum/data/lm_dataset.h"
#include "gradaccum/data/text_source.h"
#include "gradaccum/io/workload.h"
#include "gradaccum/models/built_model.h"
#include "gradaccum/models/generation.h"
#include "gradaccum/models/gguf_checkpoint.h"
#include "gradaccum/models/lora.h"
#include "gradaccum/run/process_setup.h"

namespace gradaccum::cli {

namespace {

// The checkpoint's own tokenizer when it has one: a GGUF file's, or the files beside an HF checkpoint.
data::Tokenizer load_tokenizer(const std::string& configured, const std::string& checkpoint) {
  namespace fs = std::filesystem;
  if (configured.empty() && models::is_gguf_path(checkpoint)) return data::Tokenizer::load(checkpoint);
  if (configured.empty() &&
      (fs::exists(fs::path(checkpoint) / "tokenizer.json") || fs::exists(fs::path(checkpoint) / "gpt2.tiktoken") ||
       fs::exists(fs::path(checkpoint) / "encoder.json"))) {
    return data::Tokenizer::load(checkpoint);
  }
  return data::Tokenizer::load(io::tokenizer_directory(configured));
}

models::BuiltModel load_causal_lm(const std::string& dir, const std::string& base) {
  GA_CHECK(!dir.empty(), "--checkpoint DIR (or FILE.gguf) is required");
  GA_CHECK(base.empty() || models::is_adapter_directory(dir),
           "--base: {} is not a LoRA adapter (no adapter_config.json)", dir);
  auto model = models::is_adapter_directory(dir) ? models::load_language_model_with_adapter(dir, base)
                                                 : models::load_language_model(dir, /*num_labels=*/-1, 0);
  GA_CHECK(model.causal_lm() != nullptr, "{}: a sequence classifier ({} labels), not a causal language model", dir,
           model.num_labels);
  return model;
}

}  // namespace

int run_generate(const GenerateArgs& args) {
  const run::ProcessSetup process({.threads = args.threads});
  auto model = load_causal_lm(args.checkpoint, args.base);
  const auto tokenizer = load_tokenizer(args.tokenizer, args.checkpoint);
  GA_CHECK(!tokenizer.encode(args.prompt).empty(), "--prompt: the prompt is empty");
  models::GenerationOptions options;
  options.max_new_tokens = args.max_new_tokens;
  options.temperature = args.temperature;
  options.top_k = args.top_k;
  options.seed = args.seed;
  options.max_positions = model.max_positions;
  options.stop_tokens = models::eos_token_ids(model.hf_config);
  // The continuation is printed as it is drawn.
  fmt::print("{}", args.prompt);
  std::fflush(stdout);
  models::generate_text(*model.causal_lm(), tokenizer, args.prompt, options, [](const std::string& piece) {
    fmt::print("{}", piece);
    std::fflush(stdout);
  });
  fmt::print("\n");
  return 0;
}

int run_eval(const EvalArgs& args) {
  GA_CHECK(args.batch_size >= 1, "--batch-size must be >= 1, got {}", args.batch_size);
  const run::ProcessSetup process({.threads = args.threads});
  auto model = load_causal_lm(args.checkpoint, args.base);
  const auto tokenizer = load_tokenizer(args.tokenizer, args.checkpoint);
  GA_CHECK(!args.file.empty(), "eval: a text FILE is required");
  // The formats train reads (data/text_source.h): JSON lines' "text" fields for .jsonl and .json
  // files, one document per line otherwise.
  const auto records = data::read_text_records(args.file);

  data::LmDatasetOptions options;
  // The model's context; BLOOM has no position limit, so documents are kept whole.
  int64_t longest = 2;
  const auto documents = data::encode_records(tokenizer, records);
  for (const auto& d : documents) longest = std::max<int64_t>(longest, static_cast<int64_t>(d.size()));
  options.max_length = model.max_positions > 0 ? model.max_positions : longest;
  options.pad_token_id = 0;  // any id: padding is masked and labelled -100
  data::CausalLmDataset data(documents, options);

  torch::NoGradGuard no_grad;
  auto& task = *model.task;
  task.module().eval();
  double loss_sum = 0.0;
  int64_t tokens = 0;
  for (int64_t begin = 0; begin < data.size(); begin += args.batch_size) {
    const auto indices = torch::arange(begin, std::min(begin + args.batch_size, data.size()), torch::kLong);
    const auto sums = task.evaluate(data.get(indices, torch::kFloat));
    loss_sum += sums.loss_sum.item<double>();
    tokens += sums.count.item<int64_t>();
  }
  GA_CHECK(tokens > 0, "{}: no line has two or more tokens, so nothing is predicted", args.file);
  const double loss = loss_sum / static_cast<double>(tokens);
  fmt::print("{}\n", nlohmann::json{{"loss", loss}, {"perplexity", std::exp(loss)}, {"tokens", tokens}}.dump());
  return 0;
}

}  // namespace gradaccum::cli
