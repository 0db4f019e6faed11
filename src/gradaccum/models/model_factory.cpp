#include "gradaccum/models/model_factory.h"

#include "gradaccum/base/check.h"
#include "gradaccum/models/networks.h"
#include "gradaccum/models/tasks.h"

namespace gradaccum::models {

namespace {

// What every image network checks of its section, before its own checks.
NormKind checked_image_config(const ModelConfig& config) {
  const auto norm = config.norm;
  GA_CHECK(config.norm_groups >= 1, "model.norm_groups must be >= 1, got {}", config.norm_groups);
  for (auto c : config.channels) GA_CHECK(c >= 1, "model.channels: widths must be >= 1, got {}", c);
  for (auto h : config.hidden) GA_CHECK(h >= 1, "model.hidden: widths must be >= 1, got {}", h);
  GA_CHECK(config.type == "cnn" || config.dropout == 0.0,
           "key 'model.dropout': only the cnn has a dropout site, not the {}", config.type);
  check_dropout_probability("model.dropout", config.dropout);
  for (const auto& [key, value] :
       {std::pair{"resid_pdrop", config.resid_pdrop}, std::pair{"embd_pdrop", config.embd_pdrop},
        std::pair{"attn_pdrop", config.attn_pdrop}, std::pair{"hidden_dropout", config.hidden_dropout},
        std::pair{"attention_dropout", config.attention_dropout}}) {
    GA_CHECK(value == -1, "key 'model.{}': a language model's dropout; the {} takes model.dropout", key, config.type);
  }
  return norm;
}

}  // namespace

std::unique_ptr<core::Trainable> make_mlp(const ModelConfig& config, int64_t classes) {
  const auto norm = checked_image_config(config);
  return std::make_unique<Classifier>(image_mlp(28 * 28, config.hidden, classes, norm, config.norm_groups));
}

std::unique_ptr<core::Trainable> make_cnn(const ModelConfig& config, int64_t classes) {
  const auto norm = checked_image_config(config);
  GA_CHECK(!config.channels.empty() && config.channels.size() <= 4,
           "model.channels: the cnn takes 1 to 4 conv widths, got {}", config.channels.size());
  GA_CHECK(!config.hidden.empty(), "model.hidden: the cnn needs one dense width");
  return std::make_unique<Classifier>(small_cnn(config.channels, config.hidden.front(), classes, norm,
                                                config.norm_groups, config.dropout, config.dropout_rng,
                                                config.memory_format));
}

std::unique_ptr<core::Trainable> make_resnet(const ModelConfig& config, int64_t classes) {
  const auto norm = checked_image_config(config);
  GA_CHECK(!config.channels.empty(), "model.channels: the resnet needs at least one block width");
  return std::make_unique<Classifier>(
      small_resnet(config.channels, classes, norm, config.norm_groups, config.memory_format));
}

}  // namespace gradaccum::models
