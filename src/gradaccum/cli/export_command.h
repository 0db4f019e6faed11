// `gradaccum export --merge-lora ADAPTER_DIR OUT_DIR [--base DIR]`: a LoRA adapter (PEFT's
// adapter_config.json + adapter_model.safetensors, written by a LoRA run or by PEFT) folded into
// its base model, W + scaling · B·A for every adapted layer, and written to OUT_DIR as an HF
// checkpoint (config.json + model.safetensors) with the adapter's tokenizer files beside it. The
// base is --base, else ADAPTER_DIR when it holds config.json, else adapter_config.json's
// base_model_name_or_path (models/lora.h).
#pragma once

#include <string>

namespace gradaccum::cli {

struct ExportArgs {
  std::string adapter_dir;
  std::string out_dir;
  std::string base;  // "" = the adapter's own
};

// Writes OUT_DIR (atomically, models/hf_checkpoint.h) and returns 0; bad input throws a one-line
// gradaccum::Error naming the file.
int run_export(const ExportArgs& args);

}  // namespace gradaccum::cli
