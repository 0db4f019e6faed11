#include "gradaccum/models/model_types.h"

#include <fmt/format.h>

#include "gradaccum/base/check.h"
#include "gradaccum/base/named_table.h"
#include "gradaccum/models/architectures.h"

namespace gradaccum::models {

namespace {

BuiltModel image_model(std::unique_ptr<core::Trainable> task, int64_t classes) {
  BuiltModel built;
  built.task = std::move(task);
  built.num_labels = classes;
  return built;
}

}  // namespace

const std::vector<ModelType>& model_types() {
  static const std::vector<ModelType> types = [] {
    std::vector<ModelType> t{
        {"mlp", ModelFamily::image, "a multilayer perceptron: model.hidden widths, a norm after each",
         [](const ModelConfig& c, const ModelInputs& in) { return image_model(make_mlp(c, in.classes), in.classes); }},
        {"cnn", ModelFamily::image, "1 to 4 conv blocks (model.channels) and a dense layer (model.hidden[0])",
         [](const ModelConfig& c, const ModelInputs& in) { return image_model(make_cnn(c, in.classes), in.classes); }},
        {"resnet", ModelFamily::image, "residual blocks of model.channels widths",
         [](const ModelConfig& c, const ModelInputs& in) {
           return image_model(make_resnet(c, in.classes), in.classes);
         }},
    };
    // The language models: one per decoder architecture (architectures.h).
    for (const auto& architecture : decoder_architectures()) {
      const std::string name = architecture.name;
      t.push_back({name, ModelFamily::language, architecture.help, [name](const ModelConfig& c, const ModelInputs& in) {
                     return make_language_model(name, c, in.vocab_size, in.num_labels, in.init_seed);
                   }});
    }
    return t;
  }();
  return types;
}

const ModelType& model_type(const std::string& name) { return base::find_named(model_types(), name, "model.type"); }

BuiltModel make_model(const ModelConfig& config, const ModelInputs& inputs) {
  return model_type(config.type).build(config, inputs);
}

std::unique_ptr<core::Trainable> make_image_classifier(const ModelConfig& config, int64_t classes) {
  const auto& type = model_type(config.type);
  GA_CHECK(type.family == ModelFamily::image, "key 'model.type': '{}' is not an image model", config.type);
  ModelInputs inputs;
  inputs.classes = classes;
  return type.build(config, inputs).task;
}

}  // namespace gradaccum::models
