// Using a trained language model:
//   gradaccum generate --checkpoint DIR --prompt TEXT [--max-new-tokens N]
//                      [--temperature T] [--top-k K] [--seed S]
//   gradaccum eval --checkpoint DIR FILE
// DIR is an HF checkpoint (config.json + model.safetensors), e.g. a training
// run's output_dir/final, a GGUF file of the Llama family (FILE.gguf), or a
// LoRA adapter (adapter_config.json + adapter_model.safetensors) on its base:
// --base DIR, else the adapter's own (models/lora.h). The tokenizer is
// --tokenizer, else the checkpoint's own (the GGUF file's, or the files saved
// beside the directory's model), else the default GPT-2 files.
#pragma once

#include <cstdint>
#include <string>

#include "gradaccum/io/config.h"

namespace gradaccum::cli {

struct GenerateArgs {
  std::string checkpoint;
  std::string tokenizer;  // "" = the checkpoint's own, else the default
  std::string prompt;
  int64_t max_new_tokens = models::GenerationOptions{}.max_new_tokens;  // sample.*'s defaults
  double temperature = models::GenerationOptions{}.temperature;
  int64_t top_k = models::GenerationOptions{}.top_k;
  uint64_t seed = 0;
  int64_t threads = 0;
  std::string base;  // a LoRA adapter's base ("" = the adapter's own)
};

// Prints the prompt and its continuation on one line.
int run_generate(const GenerateArgs& args);

struct EvalArgs {
  std::string checkpoint;
  std::string tokenizer;
  std::string file;
  int64_t batch_size = 16;
  int64_t threads = 0;
  std::string base;  // a LoRA adapter's base ("" = the adapter's own)
};

// Prints {"loss": ..., "perplexity": ..., "tokens": ...}: the mean loss over
// every predicted token of the file (one document per non-empty line, each
// tokenized without special tokens and truncated to the model's context; its
// tokens 2..n predicted from their prefixes, HF's labels = input_ids), its
// exponential, and how many tokens that is. Σ token losses / Σ tokens over the
// whole file — not a mean of per-line or per-batch means.
int run_eval(const EvalArgs& args);

}  // namespace gradaccum::cli
