// base::EnumNames: one table gives an enum's names, its parser and the key table's choices.
#include "gradaccum/base/enum_names.h"

#include <gtest/gtest.h>

#include <string>

#include "gradaccum/core/trainer_options.h"
#include "gradaccum/io/config.h"
#include "gradaccum/io/config_keys.h"
#include "test_support.h"

namespace enum_names_test {

using gradaccum::Error;
using gradaccum::base::EnumNames;

enum class Colour { red, green, blue };

const EnumNames<Colour>& colour_names() {
  static const EnumNames<Colour> names{{Colour::red, "red"}, {Colour::green, "green"}, {Colour::blue, "blue"}};
  return names;
}

TEST(EnumNames, NamesParseAndListInTableOrder) {
  const auto& names = colour_names();
  EXPECT_EQ(names.name(Colour::green), "green");
  EXPECT_EQ(names.parse("blue", "key 'colour'"), Colour::blue);
  EXPECT_EQ(names.find("red"), Colour::red);
  EXPECT_FALSE(names.find("Red").has_value());
  EXPECT_EQ(names.names(), (std::vector<std::string>{"red", "green", "blue"}));
  try {
    names.parse("teal", "key 'colour'");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "key 'colour': 'teal' is not one of red | green | blue");
  }
  EXPECT_THROW(names.name(static_cast<Colour>(7)), Error);
}

// The key table's choices, its default and what it stores come from the enum's one table.
TEST(EnumNames, TheKeyTableOffersAndStoresEveryName) {
  using gradaccum::io::config_keys;
  using gradaccum::io::load_config;
  const auto choices_of = [](const std::string& key) {
    for (const auto& k : config_keys())
      if (k.name == key) return k.choices;
    return std::vector<std::string>{};
  };
  namespace core = gradaccum::core;
  EXPECT_EQ(choices_of("last_window"), core::last_window_names().names());
  EXPECT_EQ(choices_of("mixed_precision"), (std::vector<std::string>{"no", "bf16", "fp16"}));
  for (const auto& name : core::last_window_names().names()) {
    EXPECT_EQ(core::last_window_names().name(load_config("", {"last_window=" + name}).trainer.last_window), name);
  }
  for (const auto& name : core::sample_order_names().names()) {
    EXPECT_EQ(
        core::sample_order_names().name(load_config("", {"train_sampling_strategy=" + name}).trainer.sample_order),
        name);
  }
  for (const auto& name : core::nan_policy_names().names()) {
    EXPECT_EQ(core::nan_policy_names().name(load_config("", {"nan_policy=" + name}).trainer.nan_policy), name);
  }
  EXPECT_EQ(load_config("", {"loss_normalization=micro_batch"}).trainer.loss_normalization,
            core::LossNormalization::micro_batch);
  EXPECT_EQ(load_config("", {"lr_scheduler_type=linear"}).trainer.lr_scheduler_type,
            gradaccum::optim::ScheduleType::linear);
  EXPECT_EQ(load_config("", {}).trainer.mixed_precision, core::MixedPrecision::none);
}

}  // namespace enum_names_test
