#include "gradaccum/cli/export_command.h"

#include <fmt/format.h>

#include <filesystem>

#include "gradaccum/base/check.h"
#include "gradaccum/base/files.h"
#include "gradaccum/models/hf_checkpoint.h"
#include "gradaccum/models/lora.h"

namespace gradaccum::cli {

namespace fs = std::filesystem;

int run_export(const ExportArgs& args) {
  GA_CHECK(!args.adapter_dir.empty() && !args.out_dir.empty(), "export: --merge-lora ADAPTER_DIR OUT_DIR is required");
  auto model = models::load_language_model_with_adapter(args.adapter_dir, args.base);
  models::merge_lora(model);
  models::write_hf_checkpoint(args.out_dir, {model.hf_config, model.weights()});
  // The tokenizer a run saved beside its adapter goes along.
  for (const char* name : {"tokenizer.json", "gpt2.tiktoken", "encoder.json", "vocab.bpe"}) {
    const auto from = fs::path(args.adapter_dir) / name;
    if (!fs::exists(from)) continue;
    base::copy_file_atomically(from.string(), (fs::path(args.out_dir) / name).string());
  }
  fmt::print("merged {} into {}\n", args.adapter_dir, args.out_dir);
  return 0;
}

}  // namespace gradaccum::cli
