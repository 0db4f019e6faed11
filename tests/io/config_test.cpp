// The configuration in-process (io/config.h, io/config_keys.h): the key table makes the default
// YAML, the checks and their messages, and the reference; the CLI tests (cli/cli_test.cpp) see
// the same errors through the program.
#include "gradaccum/io/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gradaccum/data/fashion_mnist.h"
#include "gradaccum/io/config_keys.h"
#include "gradaccum/io/workload.h"
#include "gradaccum/models/model_types.h"
#include "test_support.h"

namespace config_test {

using gradaccum::io::config_keys;
using gradaccum::io::KeyType;
using gradaccum::io::load_config;
using gradaccum::io::TrainConfig;

TrainConfig with(const std::vector<std::string>& overrides, int64_t world = 1) {
  return load_config("", overrides, world);
}

TEST(Config, TheDefaultRunHasTheTablesDefaults) {
  const auto c = with({});
  EXPECT_EQ(c.output_dir, "runs/default");
  EXPECT_EQ(c.trainer.seed, 42u);
  EXPECT_EQ(c.trainer.per_device_train_batch_size, 16);
  EXPECT_EQ(c.trainer.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.trainer.num_train_epochs, 3);
  EXPECT_DOUBLE_EQ(c.trainer.optimizer.learning_rate, 2.0e-3);
  EXPECT_DOUBLE_EQ(c.trainer.optimizer.adam_epsilon, 1.0e-8);
  EXPECT_DOUBLE_EQ(c.trainer.max_grad_norm, 1.0);
  EXPECT_EQ(c.model.type, "cnn");
  EXPECT_EQ(c.model.channels, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{128}));
  EXPECT_DOUBLE_EQ(c.model.resid_pdrop, -1.0);
  EXPECT_EQ(c.data.type, "fashion_mnist");
  EXPECT_EQ(c.trainer.loss_normalization, gradaccum::core::LossNormalization::window);
  EXPECT_EQ(c.trainer.last_window, gradaccum::core::LastWindow::partial);
  EXPECT_EQ(c.trainer.loss_scaler.growth_interval, 2000);
  EXPECT_TRUE(c.trainer.oom_recovery);
  EXPECT_TRUE(c.report_to.empty());
  // Defaults that follow other keys.
  EXPECT_EQ(c.data.directory, gradaccum::data::kFashionMnistDir);
  EXPECT_EQ(c.logging_dir, "runs/default/runs");
  EXPECT_EQ(c.trainer.grad_flow_steps, 1);  // -1: logging_steps
}

// The library's defaults (core::TrainerOptions, io::RunSettings: what run::fit runs with when a
// program sets nothing) are the key table's: one number per option, whichever way a run starts.
// logging_dir is resolved from output_dir and grad_flow_steps from logging_steps by load_config.
TEST(Config, TheLibrarysDefaultsAreTheKeyTablesDefaults) {
  const TrainConfig c = load_config("", {});
  const gradaccum::core::TrainerOptions t;
  const auto& o = c.trainer;
  EXPECT_EQ(o.per_device_train_batch_size, t.per_device_train_batch_size);
  EXPECT_EQ(o.gradient_accumulation_steps, t.gradient_accumulation_steps);
  EXPECT_EQ(o.global_batch_size, t.global_batch_size);
  EXPECT_EQ(o.num_train_epochs, t.num_train_epochs);
  EXPECT_EQ(o.max_steps, t.max_steps);
  EXPECT_EQ(o.optimizer.type, t.optimizer.type);
  EXPECT_EQ(o.optimizer.learning_rate, t.optimizer.learning_rate);
  EXPECT_EQ(o.optimizer.weight_decay, t.optimizer.weight_decay);
  EXPECT_EQ(o.optimizer.momentum, t.optimizer.momentum);
  EXPECT_EQ(o.optimizer.nesterov, t.optimizer.nesterov);
  EXPECT_EQ(o.optimizer.adam_beta1, t.optimizer.adam_beta1);
  EXPECT_EQ(o.optimizer.adam_beta2, t.optimizer.adam_beta2);
  EXPECT_EQ(o.optimizer.adam_epsilon, t.optimizer.adam_epsilon);
  EXPECT_EQ(o.lr_scheduler_type, t.lr_scheduler_type);
  EXPECT_EQ(o.warmup_steps, t.warmup_steps);
  EXPECT_EQ(o.warmup_ratio, t.warmup_ratio);
  EXPECT_EQ(o.max_grad_norm, t.max_grad_norm);
  EXPECT_EQ(o.loss_normalization, t.loss_normalization);
  EXPECT_EQ(o.last_window, t.last_window);
  EXPECT_EQ(o.seed, t.seed);
  EXPECT_EQ(o.eval_steps, t.eval_steps);
  EXPECT_EQ(o.per_device_eval_batch_size, t.per_device_eval_batch_size);
  EXPECT_EQ(o.group_by_length, t.group_by_length);
  EXPECT_EQ(o.sample_order, t.sample_order);
  EXPECT_EQ(o.save_steps, t.save_steps);
  EXPECT_EQ(o.nan_policy, t.nan_policy);
  EXPECT_EQ(o.deterministic_accumulation, t.deterministic_accumulation);
  EXPECT_EQ(o.oom_recovery, t.oom_recovery);
  EXPECT_EQ(o.max_tokens_per_micro_batch, t.max_tokens_per_micro_batch);
  EXPECT_EQ(o.window_tokens, t.window_tokens);
  EXPECT_EQ(o.dtype, t.dtype);
  EXPECT_EQ(o.device, t.device);
  EXPECT_EQ(o.mixed_precision, t.mixed_precision);
  EXPECT_EQ(o.loss_scaler.init_scale, t.loss_scaler.init_scale);
  EXPECT_EQ(o.loss_scaler.growth_factor, t.loss_scaler.growth_factor);
  EXPECT_EQ(o.loss_scaler.backoff_factor, t.loss_scaler.backoff_factor);
  EXPECT_EQ(o.loss_scaler.growth_interval, t.loss_scaler.growth_interval);

  const gradaccum::io::RunSettings r;
  EXPECT_EQ(c.output_dir, r.output_dir);
  EXPECT_EQ(c.threads, r.threads);
  EXPECT_EQ(c.custom_kernels, r.custom_kernels);
  EXPECT_EQ(c.bf16_cpu_matmuls, r.bf16_cpu_matmuls);
  EXPECT_EQ(c.logging_steps, r.logging_steps);
  EXPECT_EQ(c.report_to, r.report_to);
  EXPECT_EQ(c.logging_dir, c.output_dir + "/runs");
  EXPECT_EQ(c.resume_from_checkpoint, r.resume_from_checkpoint);
  EXPECT_EQ(c.overwrite_output_dir, r.overwrite_output_dir);
  EXPECT_EQ(c.allow_batch_change, r.allow_batch_change);
  EXPECT_EQ(c.save_total_limit, r.save_total_limit);
  EXPECT_EQ(c.dist_timeout_s, r.dist_timeout_s);
  EXPECT_EQ(c.profile_from_step, r.profile_from_step);
  EXPECT_EQ(c.profile_steps, r.profile_steps);
  EXPECT_EQ(c.ddp_bucket_cap_mb, r.ddp_bucket_cap_mb);
  EXPECT_EQ(c.sync_each_micro_step, r.sync_each_micro_step);
  EXPECT_EQ(c.zero_stage, r.zero_stage);
  EXPECT_EQ(c.sharded_grad_sync, r.sharded_grad_sync);
  // A training run's sample and `gradaccum generate` draw with the same defaults.
  const gradaccum::models::GenerationOptions g;
  EXPECT_EQ(c.sample.max_new_tokens, g.max_new_tokens);
  EXPECT_EQ(c.sample.temperature, g.temperature);
  EXPECT_EQ(c.sample.top_k, g.top_k);
}

TEST(Config, EveryKeyIsInTheDefaultYamlAndTakesItsDefaultThroughSet) {
  const auto& yaml = gradaccum::io::default_config_yaml();
  int values = 0;
  for (const auto& key : config_keys()) {
    const auto leaf = key.name.substr(key.name.rfind('.') + 1);
    EXPECT_NE(yaml.find(leaf + ":"), std::string::npos) << key.name;
    EXPECT_FALSE(key.help.empty()) << key.name << ": every key has one line of help";
    if (key.type == KeyType::section) continue;
    ++values;
    // data.type fashion_mnist with model.type cnn: the defaults agree, one key at a time.
    EXPECT_NO_THROW(with({key.name + "=" + key.default_yaml})) << key.name;
  }
  EXPECT_EQ(values, 115);  // a key added or removed changes this count: say so in the reference too
}

TEST(Config, AKeysRuleNamesTheKeyTheRuleAndTheValue) {
  // threads' bound depends on the machine: the rule says how, the error also what it is here.
  const auto threads_here = fmt::format("; at most {} on this machine of {} cores", gradaccum::io::max_threads(),
                                        std::thread::hardware_concurrency());
  EXPECT_ONE_LINE_ERROR(with({"threads=-1"}), "key 'threads': must be in [0, max(1024, 4 x cores)] (0 = all cores)" +
                                                  threads_here + ", got -1");
  EXPECT_ONE_LINE_ERROR(with({"threads=100000"}), threads_here + ", got 100000");
  EXPECT_EQ(with({fmt::format("threads={}", gradaccum::io::max_threads())}).threads, gradaccum::io::max_threads());
  EXPECT_ONE_LINE_ERROR(with({"adam_epsilon=0"}), "key 'adam_epsilon': must be > 0, got 0");
  EXPECT_ONE_LINE_ERROR(with({"zero_stage=4"}), "key 'zero_stage': must be 0, 1, 2 or 3, got 4");
  EXPECT_ONE_LINE_ERROR(with({"zero_stage=2", "sharded_grad_sync=sometimes"}),
                        "key 'sharded_grad_sync': 'sometimes' is not one of each_micro_step | defer | auto");
  EXPECT_ONE_LINE_ERROR(with({"sharded_grad_sync=defer"}),
                        "key 'sharded_grad_sync': it applies to zero_stage: 2 and 3 only, and zero_stage is 0");
  EXPECT_ONE_LINE_ERROR(with({"zero_stage=2", "sync_each_micro_step=true"}),
                        "key 'sync_each_micro_step': zero_stage: 2 reduces by sharded_grad_sync; set "
                        "sharded_grad_sync=each_micro_step instead");
  EXPECT_EQ(with({"zero_stage=2"}).trainer.grad_flow_steps, 0);  // ranks hold shards, not whole gradients
  EXPECT_ONE_LINE_ERROR(with({"loss_scaler.backoff_factor=1"}),
                        "key 'loss_scaler.backoff_factor': must be in (0, 1), got 1");
  EXPECT_ONE_LINE_ERROR(with({"warmup_ratio=1.5"}), "key 'warmup_ratio': must be in [0, 1], got 1.5");
  EXPECT_ONE_LINE_ERROR(with({"model.attn_pdrop=1"}),
                        "key 'model.attn_pdrop': must be in [0, 1), or -1 for the checkpoint's (else 0), got 1");
  EXPECT_ONE_LINE_ERROR(with({"output_dir="}), "key 'output_dir': must be a directory, got ''");
}

TEST(Config, TypesAndChoicesComeFromTheTable) {
  EXPECT_ONE_LINE_ERROR(with({"seed=many"}), "key 'seed': expected an integer, got 'many'");
  EXPECT_ONE_LINE_ERROR(with({"data.packing=maybe"}), "key 'data.packing': expected true or false, got 'maybe'");
  EXPECT_ONE_LINE_ERROR(with({"model.channels=7"}), "key 'model.channels': expected a list of integers, got '7'");
  EXPECT_ONE_LINE_ERROR(with({"model.type=transformer"}),
                        "key 'model.type': 'transformer' is not one of mlp | cnn | resnet | gpt2 | bloom");
  EXPECT_ONE_LINE_ERROR(with({"data.type=imagenet"}),
                        "key 'data.type': 'imagenet' is not one of fashion_mnist | kjv | kjv_testament | text | "
                        "text_classification | random_tokens");
  EXPECT_ONE_LINE_ERROR(with({"report_to=[tensorboard, wandb]"}),
                        "key 'report_to': 'wandb' is not one of none | tensorboard");
  EXPECT_ONE_LINE_ERROR(with({"report_to=[none, tensorboard]"}),
                        "key 'report_to': 'none' cannot be combined with other names");
  EXPECT_EQ(with({"report_to=[tensorboard, tensorboard]"}).report_to, (std::vector<std::string>{"tensorboard"}));
  EXPECT_ONE_LINE_ERROR(with({"model.kind=cnn"}), "unknown key 'model.kind'");
}

TEST(Config, TheChoicesOfModelAndDataTypesAreTheirTables) {
  const auto* model_type = gradaccum::io::find_config_key("model.type");
  const auto* data_type = gradaccum::io::find_config_key("data.type");
  ASSERT_NE(model_type, nullptr);
  ASSERT_NE(data_type, nullptr);
  ASSERT_EQ(model_type->choices.size(), gradaccum::models::model_types().size());
  for (size_t i = 0; i < model_type->choices.size(); ++i) {
    EXPECT_EQ(model_type->choices[i], gradaccum::models::model_types()[i].name);
  }
  ASSERT_EQ(data_type->choices.size(), gradaccum::io::data_types().size());
  for (size_t i = 0; i < data_type->choices.size(); ++i) {
    EXPECT_EQ(data_type->choices[i], gradaccum::io::data_types()[i].name);
  }
  // A family mismatch names both keys.
  EXPECT_ONE_LINE_ERROR(with({"data.type=kjv"}), "key 'data.type': kjv data needs a language model");
  EXPECT_ONE_LINE_ERROR(with({"model.type=gpt2"}), "key 'data.type': fashion_mnist data needs an image model");
}

TEST(Config, KeysThatTieTogetherAreCheckedAfterEachOnItsOwn) {
  EXPECT_ONE_LINE_ERROR(with({"nesterov=true"}), "key 'nesterov': must be false unless momentum > 0, got true");
  EXPECT_NO_THROW(with({"nesterov=true", "momentum=0.9", "optim=sgd"}));
  EXPECT_ONE_LINE_ERROR(with({"dtype=float64", "mixed_precision=bf16"}),
                        "key 'mixed_precision': bf16 keeps parameters in float32 and needs dtype: float32");
  EXPECT_ONE_LINE_ERROR(with({"window_tokens=64", "last_window=carry"}),
                        "key 'window_tokens': cannot be combined with last_window: carry");
  EXPECT_ONE_LINE_ERROR(with({"deterministic_accumulation=true"}, 3),
                        "key 'deterministic_accumulation': the world size must be a power of two, not 3");
}

TEST(Config, TheBatchArithmeticAndAuto) {
  // global_batch_size fixes N from b and the world: 256 = 16 x 4 x 4.
  const auto global = with({"global_batch_size=256"}, 4);
  EXPECT_EQ(global.trainer.gradient_accumulation_steps, 4);
  EXPECT_NE(global.resolved_yaml.find("gradient_accumulation_steps: 4"), std::string::npos);
  EXPECT_ONE_LINE_ERROR(with({"global_batch_size=100"}, 3), "100");
  // auto: b = 1 until the plan runs, N = the global batch per process.
  const auto planned = with({"per_device_train_batch_size=auto", "global_batch_size=64"}, 2);
  EXPECT_TRUE(planned.plan_decomposition);
  EXPECT_EQ(planned.trainer.per_device_train_batch_size, 1);
  EXPECT_EQ(planned.trainer.gradient_accumulation_steps, 32);
  EXPECT_ONE_LINE_ERROR(with({"per_device_train_batch_size=auto"}),
                        "key 'per_device_train_batch_size': auto plans a decomposition of global_batch_size");
  EXPECT_ONE_LINE_ERROR(with({"per_device_eval_batch_size=auto"}),
                        "key 'per_device_eval_batch_size': expected an integer, got 'auto'");
}

TEST(Config, TheResolvedYamlLoadsBackToTheSameConfiguration) {
  const auto first =
      with({"model.type=resnet", "model.channels=[8, 16]", "learning_rate=0.01", "report_to=tensorboard"});
  const auto dir = gradaccum::testing::make_temp_dir("config_round_trip");
  const auto path = dir + "/config.yaml";
  std::ofstream(path) << first.resolved_yaml;
  const auto second = load_config(path, {});
  EXPECT_EQ(second.resolved_yaml, first.resolved_yaml);
  EXPECT_EQ(second.model.channels, (std::vector<int64_t>{8, 16}));
  EXPECT_DOUBLE_EQ(second.trainer.optimizer.learning_rate, 0.01);
  EXPECT_EQ(second.report_to, (std::vector<std::string>{"tensorboard"}));
}

// docs/config.md is the generated reference; regenerate it with
// `gradaccum config --reference > docs/config.md`.
TEST(Config, TheReferenceInDocsIsTheTablesOwn) {
  std::ifstream in(std::string(GRADACCUM_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in.good()) << "docs/config.md is missing";
  std::stringstream text;
  text << in.rdbuf();
  const auto reference = gradaccum::io::config_reference_markdown();
  EXPECT_EQ(text.str(), reference) << "docs/config.md is stale: run `gradaccum config --reference > docs/config.md`";
  for (const auto& key : config_keys()) EXPECT_NE(reference.find(key.name), std::string::npos) << key.name;
}

}  // namespace config_test
