// The architectures `model.type` names. Adding one is one entry in model_types()
// (models/model_types.cpp): its name, family, one line of help and its builder. The
// configuration's choices, its checks of data against model, the default YAML and the
// configuration reference (docs/config.md) all read this table.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gradaccum/models/built_model.h"
#include "gradaccum/models/model_factory.h"

namespace gradaccum::models {

// What a model takes in: 28×28 grey images with class labels, or token ids.
enum class ModelFamily { image, language };

// What a builder needs beyond the `model:` section.
struct ModelInputs {
  int64_t classes = 0;     // image models: the number of classes
  int64_t vocab_size = 0;  // language models: the data's ids (model.vocab_size may be larger)
  int64_t num_labels = 0;  // language models: 0 = a causal LM, else a sequence classifier
  uint64_t init_seed = 0;  // language models: their initialization
};

struct ModelType {
  std::string name;
  ModelFamily family;
  std::string help;  // one line for the configuration reference
  std::function<BuiltModel(const ModelConfig&, const ModelInputs&)> build;
};

// Every model type, in the order the reference lists them.
const std::vector<ModelType>& model_types();

// The entry named `name`; a gradaccum::Error naming the key and the choices otherwise.
const ModelType& model_type(const std::string& name);

// Builds `config.type` (through its table entry).
BuiltModel make_model(const ModelConfig& config, const ModelInputs& inputs);

// An image classifier for 28×28 grey images: `config.type` must be an image model.
std::unique_ptr<core::Trainable> make_image_classifier(const ModelConfig& config, int64_t classes);

}  // namespace gradaccum::models
