// LoRA adapters (Hu et al. 2021) on a language model's Linear layers, as Hugging Face PEFT makes,
// saves and loads them, so that an adapter trained here loads in PEFT and one PEFT wrote loads here.
//
// An adapted Linear layer computes y = base(x) + scaling · B(A(dropout(x))) with A [r, in] and
// B [out, r]; A starts Kaiming-uniform with a = √5 (uniform in ±1/√in, PEFT's default, drawn from
// a generator of its own), B at zero, so a fresh adapter leaves the model's output unchanged.
// scaling = alpha / r, or alpha / √r with rsLoRA. The adapter's dropout is a SampleDropout site
// (sample_dropout.h): its masks do not depend on the decomposition of the batch.
//
// The adapter's matrices are registered on the adapted layer as `lora_A` and `lora_B` (Linear
// modules without bias), so their parameters are named `<layer>.lora_A.weight` and
// `<layer>.lora_B.weight`: PEFT's saved names with its `base_model.model.` prefix and the adapter
// name left out. models::linear (linear.h), through which every decoder's Linear layers run, adds
// the adapter's term. Every other parameter gets requires_grad false, except those of
// `modules_to_save` (trained in full, e.g. a classifier's `score`), so the engine trains and
// communicates the adapters and those modules only, and keeps no gradient or optimizer state for
// the frozen base.
//
// PEFT's files (huggingface/peft, checkpoint format):
//   adapter_model.safetensors  base_model.model.<HF module path>.lora_A.weight [r, in] and
//                              .lora_B.weight [out, r]; modules_to_save as
//                              base_model.model.<HF module path>.weight (HF's layout)
//   adapter_config.json        peft_type LORA, r, lora_alpha, lora_dropout, target_modules,
//                              use_rslora, modules_to_save, task_type (CAUSAL_LM | SEQ_CLS),
//                              base_model_name_or_path, bias "none"
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gradaccum/base/enum_names.h"
#include "gradaccum/models/built_model.h"
#include "gradaccum/models/lora_adapter.h"
#include "gradaccum/models/sample_dropout.h"

namespace gradaccum::models {

// The `lora:` section (PEFT's LoraConfig names in adapter_config.json).
struct LoraConfig {
  int64_t r = 8;
  double alpha = 8.0;
  double dropout = 0.0;
  // Module names as HF spells them; a name matches every Linear layer whose HF path is it or
  // ends with "." + it (PEFT's rule). Empty: no adapters (full fine-tuning).
  std::vector<std::string> target_modules;
  bool use_rslora = false;
  std::vector<std::string> modules_to_save;  // trained in full (same matching rule)
  // The dtype the frozen base's Linear weights are held in: float32 or bfloat16
  // (lora_base_dtype_names).
  torch::ScalarType base_dtype = torch::kFloat;
  // "" : fresh adapters (A random, B zero); else a PEFT adapter directory they start from
  // (init_lora_from_adapter).
  std::string init_from;

  bool enabled() const { return !target_modules.empty(); }
  double scaling() const;
};

// lora.base_dtype's spellings: float32, bfloat16.
const base::EnumNames<torch::ScalarType>& lora_base_dtype_names();

// The adapters of a model and how they were configured.
struct LoraAdapters {
  LoraConfig config;
  std::string architecture;          // the model's entry in the architecture table
  int64_t num_labels = 0;            // 0: CAUSAL_LM; else SEQ_CLS
  std::string base;                  // base_model_name_or_path ("" = none known)
  std::vector<std::string> adapted;  // the adapted layers' module paths, in registration order
  std::vector<std::string> saved;    // modules_to_save's module paths
};

// Attaches adapters to `model` as `config` says, freezes the rest but modules_to_save (a
// classifier's `score` always trains, as PEFT's SEQ_CLS task adds it), and rebuilds the task so
// that its dropout sites include the adapters'. Errors name `what` and the key ("lora.r" when
// `what` is "lora", an adapter_config.json's key otherwise): r ≤ 0, alpha ≤ 0, a dropout outside
// [0, 1), a target or module to save that matches nothing, a target that is not one of the
// decoder's Linear layers. `init_seed` draws the A matrices; `base` is recorded as
// base_model_name_or_path.
void attach_lora(BuiltModel& model, const LoraConfig& config, uint64_t init_seed, DropoutRng dropout_rng,
                 const std::string& base, const std::string& what = "lora");

// adapter_config.json of a model's adapters.
nlohmann::json peft_adapter_config(const LoraAdapters& adapters);

// The LoraConfig of an adapter_config.json; errors name `what` (the file) and the key: another
// peft_type, a bias other than "none", DoRA, per-layer rank or alpha patterns, a missing r.
LoraConfig lora_config_from_peft(const nlohmann::json& config, const std::string& what);

// The trainable tensors (adapters and modules_to_save) under PEFT's names and HF's layouts, CPU copies.
WeightList peft_adapter_tensors(BuiltModel& model);

// Loads PEFT-named tensors into the adapters and modules_to_save of `model`; errors name `what`
// and the tensor (a missing or unexpected one, a shape that disagrees with the base's layer).
void load_peft_adapter_tensors(BuiltModel& model, const WeightList& tensors, const std::string& what);

// The base of an adapter directory: `base` when given, else ADAPTER_DIR itself when it holds
// config.json, else its adapter_config.json's base_model_name_or_path; with the adapter loaded onto it.
// Errors name the directory and what is missing or wrong.
BuiltModel load_language_model_with_adapter(const std::string& adapter_dir, const std::string& base);

// Sets the attached adapters (and modules_to_save) of `model` to those saved in `adapter_dir`, to
// continue training an adapter. Its adapter_config.json must agree with model.lora's config on r,
// alpha, use_rslora and target_modules (an error names `what`, the file and the key otherwise); its
// tensors are checked as load_peft_adapter_tensors checks them (modules_to_save included).
void init_lora_from_adapter(BuiltModel& model, const std::string& adapter_dir, const std::string& what);

// Whether `dir` holds a PEFT adapter (adapter_config.json).
bool is_adapter_directory(const std::string& dir);

// Folds every adapter into its layer's weight (W += scaling · B·A, in float64) and removes the
// adapters: the model is then a plain one whose weights() are an HF checkpoint's.
void merge_lora(BuiltModel& model);

}  // namespace gradaccum::models
