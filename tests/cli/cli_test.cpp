// The `gradaccum` program end to end: decomposition invariance through the
// files it writes, its outputs, and one-line errors on bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "test_support.h"

namespace cli_test {

using gradaccum::testing::CliResult;
using gradaccum::testing::make_temp_dir;
using gradaccum::testing::read_text;
using gradaccum::testing::run_cli;
namespace fs = std::filesystem;

using gradaccum::testing::read_jsonl;

int count_lines(const std::string& text) { return static_cast<int>(std::count(text.begin(), text.end(), '\n')); }

// A small CNN run in float64: 640 training samples, 10 optimizer steps of 64.
const std::string kSmallCnn =
    "--set model.type=cnn --set model.norm=group --set model.channels=[4,8] --set model.hidden=[16] "
    "--set dtype=float64 --set data.train_limit=640 --set data.eval_limit=200 --set max_steps=10 "
    "--set threads=2 --set learning_rate=3e-3 --set warmup_steps=2";

TEST(CliEndToEnd, DecompositionsWriteTheSameLossAndGradNormFloat64) {
  const auto root = make_temp_dir("decomposition");
  std::vector<std::vector<nlohmann::json>> runs;
  for (const char* split : {"64 --set gradient_accumulation_steps=1", "16 --set gradient_accumulation_steps=4",
                            "4 --set gradient_accumulation_steps=16"}) {
    const auto out = root + "/run" + std::to_string(runs.size());
    const auto r =
        run_cli("train " + kSmallCnn + " --set output_dir=" + out + " --set per_device_train_batch_size=" + split);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    runs.push_back(read_jsonl(out + "/metrics.jsonl"));
  }
  // 10 step lines + 1 eval line each.
  for (const auto& run : runs) ASSERT_EQ(run.size(), 11u);
  const int64_t micro_steps[] = {1, 4, 16};
  for (size_t k = 0; k < runs.size(); ++k) {
    for (size_t i = 0; i < 10; ++i) {
      const auto& a = runs[0][i];
      const auto& b = runs[k][i];
      EXPECT_EQ(b["step"].get<int64_t>(), static_cast<int64_t>(i + 1));
      EXPECT_EQ(b["items"].get<int64_t>(), 64);
      EXPECT_EQ(b["micro_steps"].get<int64_t>(), micro_steps[k]);
      EXPECT_NEAR(b["loss"].get<double>(), a["loss"].get<double>(), 1e-10 * a["loss"].get<double>());
      EXPECT_NEAR(b["grad_norm"].get<double>(), a["grad_norm"].get<double>(), 1e-10 * a["grad_norm"].get<double>());
      EXPECT_EQ(b["lr"].get<double>(), a["lr"].get<double>());
    }
    EXPECT_NEAR(runs[k][10]["eval_loss"].get<double>(), runs[0][10]["eval_loss"].get<double>(),
                1e-9 * runs[0][10]["eval_loss"].get<double>());
  }
  // Training happened: the loss moved.
  EXPECT_LT(runs[0][9]["loss"].get<double>(), runs[0][0]["loss"].get<double>());
  fs::remove_all(root);
}

TEST(CliEndToEnd, WritesConfigMetricsAndSummary) {
  const auto out = make_temp_dir("outputs") + "/run";
  const auto r = run_cli("train " + kSmallCnn + " --set dtype=float32 --set max_steps=3 --set output_dir=" + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("test accuracy: "), std::string::npos);
  const auto summary = nlohmann::json::parse(read_text(out + "/summary.json"));
  EXPECT_EQ(summary["steps"].get<int64_t>(), 3);
  EXPECT_EQ(summary["samples"].get<int64_t>(), 192);
  EXPECT_EQ(summary["global_batch_size"].get<int64_t>(), 64);
  EXPECT_EQ(summary["eval_samples"].get<int64_t>(), 200);
  for (const char* key : {"wall_s", "train_loss", "samples_per_s", "peak_rss_mb", "eval_loss", "eval_accuracy"}) {
    EXPECT_TRUE(summary.contains(key)) << key;
  }
  const auto lines = read_jsonl(out + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 4u);
  for (const char* key : {"step", "epoch", "loss", "lr", "grad_norm", "grad_norm_clipped", "weight_norm", "items",
                          "samples", "micro_steps", "skipped", "time_s", "samples_per_s", "peak_rss_mb"}) {
    EXPECT_TRUE(lines[0].contains(key)) << key;
  }
  EXPECT_LE(lines[0]["grad_norm_clipped"].get<double>(), 1.0 + 1e-6);
  const auto config = read_text(out + "/config.yaml");
  EXPECT_NE(config.find("max_steps: 3"), std::string::npos);
  EXPECT_NE(config.find("gradient_accumulation_steps: 4"), std::string::npos);
}

// How many complete operator events named `name` a Chrome trace holds.
int64_t trace_events_named(const std::string& path, const std::string& name) {
  const auto trace = nlohmann::json::parse(read_text(path));
  int64_t count = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") == "X" && e.value("name", "") == name) ++count;
  }
  return count;
}

// Five float32 steps of the small CNN with the profiler over steps first..first+count-1; returns
// the trace's path.
std::string traced_run(int first, int count, std::string* out = nullptr) {
  const auto dir = make_temp_dir("profiler-" + std::to_string(first)) + "/run";
  const auto r = run_cli("train " + kSmallCnn + " --set dtype=float32 --set max_steps=5 --set data.eval_limit=-1" +
                         " --set profile_from_step=" + std::to_string(first) +
                         " --set profile_steps=" + std::to_string(count) + " --set output_dir=" + dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (out != nullptr) *out = r.out;
  return dir + "/profiler/trace-rank0.json";
}

TEST(CliEndToEnd, ProfilerTracesTheChosenOptimizerSteps) {
  // The CNN has two convolutions: 16 x 4 runs 8 aten::conv2d calls per optimizer step.
  std::string out;
  const auto trace = traced_run(2, 2, &out);
  EXPECT_NE(out.find("profiler: optimizer steps 2 to 3 traced to " + trace), std::string::npos) << out;
  EXPECT_EQ(trace_events_named(trace, "aten::conv2d"), 2 * 4 * 2);
  EXPECT_FALSE(std::filesystem::exists(trace + ".tmp"));
  // Operators carry their input shapes: the first convolution sees the 16 images and conv0's
  // 4 one-channel 3 × 3 kernels, the dense layer's addmm the flattened 8 × 7 × 7 features.
  const auto events = nlohmann::json::parse(read_text(trace))["traceEvents"];
  std::set<std::string> conv_inputs, addmm_inputs;
  for (const auto& e : events) {
    if (e.value("ph", "") != "X" || !e.contains("args") || !e["args"].contains("Input Dims")) continue;
    if (e["name"] == "aten::conv2d") conv_inputs.insert(e["args"]["Input Dims"].dump());
    if (e["name"] == "aten::addmm") addmm_inputs.insert(e["args"]["Input Dims"].dump());
  }
  EXPECT_EQ(conv_inputs.count("[[16,1,28,28],[4,1,3,3],[],[],[],[],[]]"), 1u) << ::testing::PrintToString(conv_inputs);
  EXPECT_EQ(addmm_inputs.count("[[16],[16,392],[392,16],[],[]]"), 1u) << ::testing::PrintToString(addmm_inputs);
  // A run that ends inside the traced steps writes what it traced: step 5 alone.
  EXPECT_EQ(trace_events_named(traced_run(5, 10), "aten::conv2d"), 2 * 4);
}

TEST(CliEndToEnd, BatchNormWithAccumulationWarns) {
  const auto out = make_temp_dir("bn") + "/run";
  const auto r = run_cli("train " + kSmallCnn + " --set model.norm=batch --set max_steps=1 --set output_dir=" + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: BatchNorm in training mode (model.norm0, model.norm1)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model.norm=group"), std::string::npos);
  // Not split: no warning.
  const auto single = run_cli("train " + kSmallCnn +
                              " --set model.norm=batch --set max_steps=1 "
                              "--set per_device_train_batch_size=64 --set gradient_accumulation_steps=1 "
                              "--set output_dir=" +
                              out + "-single");
  ASSERT_EQ(single.exit_code, 0) << single.err;
  EXPECT_EQ(single.err.find("BatchNorm"), std::string::npos);
}

TEST(Cli, PrintConfigVersionAndHelp) {
  const auto config = run_cli("train --print-config --set learning_rate=0.5 --set global_batch_size=128");
  ASSERT_EQ(config.exit_code, 0);
  EXPECT_NE(config.out.find("learning_rate: 0.5"), std::string::npos);
  EXPECT_NE(config.out.find("gradient_accumulation_steps: 8"), std::string::npos);  // 128 / 16
  const auto version = run_cli("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.out.find("gradaccum "), std::string::npos);
  const auto help = run_cli("train --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--set"), std::string::npos);
}

struct BadInput {
  std::string name;
  std::string args;     // after "train"
  std::string config;   // YAML written to a file passed as CONFIG ("" = none)
  std::string message;  // expected in the one-line error
};

// Names the case in test listings instead of dumping its bytes.
void PrintTo(const BadInput& c, std::ostream* os) { *os << c.name; }

class CliBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(CliBadInput, OneLineErrorNonZeroExitNoOutputDirectory) {
  const auto& c = GetParam();
  const auto dir = make_temp_dir("bad-" + c.name);
  const auto out = dir + "/out";
  std::string args = "train ";
  if (!c.config.empty()) {
    std::ofstream(dir + "/config.yaml") << c.config;
    args += dir + "/config.yaml ";
  }
  args += c.args + " --set output_dir=" + out;
  const CliResult r = run_cli(args);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128) << "crashed: " << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("gradaccum: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out)) << "output directory created for bad input";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Errors, CliBadInput,
    ::testing::Values(
        BadInput{"unknown_key", "--set learning_rat=0.1", "", "unknown key 'learning_rat'"},
        BadInput{"unknown_nested_key", "", "model:\n  kind: cnn\n", "unknown key 'model.kind'"},
        BadInput{"wrong_type", "--set learning_rate=fast", "", "key 'learning_rate': expected a number, got 'fast'"},
        BadInput{"wrong_type_file", "", "per_device_train_batch_size: [1, 2]\n",
                 "key 'per_device_train_batch_size': expected an integer, got a list"},
        BadInput{"zero_accumulation", "--set gradient_accumulation_steps=0", "",
                 "key 'gradient_accumulation_steps': must be >= 1, got 0"},
        BadInput{"negative_lr", "--set learning_rate=-0.1", "", "key 'learning_rate': must be >= 0, got -0.1"},
        BadInput{"global_not_divisible", "--set global_batch_size=100", "",
                 "global_batch_size 100 is not a multiple of per_device_train_batch_size 16 x world size 1 = 16"},
        BadInput{"bad_choice", "--set model.norm=instance", "", "key 'model.norm': 'instance' is not one of"},
        BadInput{"group_by_length_without_lengths", "--set data.group_by_length=true", "",
                 "key 'data.group_by_length': the samples of data.type fashion_mnist have no length to group by"},
        BadInput{"malformed_yaml", "", "learning_rate: [1, 2\n", "malformed YAML at line"},
        BadInput{"missing_dataset", "--set data.directory=/nonexistent", "", "apt-get install dataset-fashion-mnist"},
        BadInput{"bad_set_syntax", "--set learning_rate", "", "--set 'learning_rate': expected key=value"},
        // b × N wraps in int64 to 0 (a division by zero), to a negative count, or to 1: refused with
        // the factors named, never the wrapped product.
        BadInput{"micro_batch_times_steps_wraps_to_zero",
                 "--set per_device_train_batch_size=4611686018427387904 --set gradient_accumulation_steps=4", "",
                 "per_device_train_batch_size 4611686018427387904 x gradient_accumulation_steps 4 x world size 1 is "
                 "more than the largest global batch, 2^53 = 9007199254740992 samples"},
        BadInput{"micro_batch_times_steps_wraps_negative",
                 "--set per_device_train_batch_size=4611686018427387904 --set gradient_accumulation_steps=3", "",
                 "per_device_train_batch_size 4611686018427387904 x gradient_accumulation_steps 3 x world size 1 is "
                 "more than the largest global batch"},
        BadInput{"micro_batch_times_steps_wraps_to_one",
                 "--set per_device_train_batch_size=9223372036854775807 "
                 "--set gradient_accumulation_steps=9223372036854775807",
                 "", "gradient_accumulation_steps 9223372036854775807 x world size 1 is more than the largest"},
        BadInput{"global_batch_too_large", "--set global_batch_size=9223372036854775807", "",
                 "global_batch_size 9223372036854775807 is more than the largest global batch"},
        BadInput{"threads_above_the_bound", "--set threads=100000", "",
                 "key 'threads': must be in [0, max(1024, 4 x cores)] (0 = all cores); at most "},
        // .inf passes a ">= 0" rule; every number is checked finite where the key table reads numbers.
        BadInput{"infinite_learning_rate", "--set learning_rate=.inf", "",
                 "key 'learning_rate': must be a finite number, got '.inf'"},
        BadInput{"infinite_weight_decay", "--set weight_decay=.inf", "",
                 "key 'weight_decay': must be a finite number, got '.inf'"},
        BadInput{"infinite_adam_epsilon", "", "adam_epsilon: .inf\n",
                 "key 'adam_epsilon': must be a finite number, got '.inf'"},
        BadInput{"infinite_max_grad_norm", "--set max_grad_norm=.Inf", "",
                 "key 'max_grad_norm': must be a finite number, got '.Inf'"},
        BadInput{"infinite_temperature", "--set sample.temperature=.inf", "",
                 "key 'sample.temperature': must be a finite number, got '.inf'"},
        BadInput{"infinite_growth_factor", "--set loss_scaler.growth_factor=.inf", "",
                 "key 'loss_scaler.growth_factor': must be a finite number, got '.inf'"},
        BadInput{"nan_learning_rate", "--set learning_rate=.nan", "",
                 "key 'learning_rate': must be a finite number, got '.nan'"},
        BadInput{"norm_groups_not_dividing", "--set model.norm_groups=7", "",
                 "key 'model.norm_groups': 7 groups do not divide the width 32 in model.channels"},
        BadInput{"norm_groups_not_dividing_mlp", "--set model.type=mlp --set model.norm_groups=3", "",
                 "key 'model.norm_groups': 3 groups do not divide the width 128 in model.hidden"},
        BadInput{"duplicate_key", "", "learning_rate: 0.1\nseed: 3\nlearning_rate: 0.2\n",
                 "config.yaml:3: duplicate key 'learning_rate' (first at line 1)"},
        BadInput{"duplicate_nested_key", "", "model:\n  type: cnn\n  norm: group\n  type: mlp\n",
                 "config.yaml:4: duplicate key 'model.type' (first at line 2)"},
        BadInput{"invalid_bytes_are_escaped", "", "learning_rate: \x01\xfe\n",
                 "key 'learning_rate': expected a number, got '\\x01\\xfe'"},
        BadInput{"hf_checkpoint_is_the_weights_file",
                 "--set model.type=gpt2 --set data.type=kjv --set model.hf_checkpoint=" +
                     std::string(GRADACCUM_TEST_DATA) + "/hf_gpt2/model.safetensors",
                 "",
                 "key 'model.hf_checkpoint': " + std::string(GRADACCUM_TEST_DATA) +
                     "/hf_gpt2/model.safetensors is a file; give the directory that holds config.json and "
                     "model.safetensors (" +
                     std::string(GRADACCUM_TEST_DATA) + "/hf_gpt2), or a .gguf file"}),
    [](const auto& info) { return info.param.name; });

TEST(CliBadInputFiles, MissingConfigFileIsNamed) {
  const auto r = run_cli("train /nonexistent/run.yaml");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "gradaccum: error: /nonexistent/run.yaml: no such configuration file\n");
}

// A configuration path that exists but is no file says what it is.
TEST(CliBadInputFiles, DirectoryOrDeviceAsConfigSaysWhatItIs) {
  const auto dir = make_temp_dir("config-dir");
  const auto directory = run_cli("train " + dir);
  EXPECT_EQ(directory.exit_code, 1);
  EXPECT_EQ(directory.err, "gradaccum: error: " + dir + ": is a directory, not a configuration file\n");
  const auto device = run_cli("train /dev/zero");
  EXPECT_EQ(device.exit_code, 1);
  EXPECT_EQ(device.err, "gradaccum: error: /dev/zero: is a device, not a configuration file\n");
}

// A binary file as the configuration: its bytes are escaped, and a long scalar is cut.
TEST(CliBadInputFiles, BinaryConfigShowsEscapedBytesOnOneLine) {
  const auto dir = make_temp_dir("config-binary");
  std::string bytes;  // UTF-8 continuation bytes with no lead byte: none is valid text
  for (int i = 0; i < 400; ++i) bytes += static_cast<char>(0x80 + (i * 37) % 0x40);
  std::ofstream(dir + "/run.yaml", std::ios::binary) << "x" << bytes;
  const auto r = run_cli("train " + dir + "/run.yaml --set output_dir=" + dir + "/out");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("gradaccum: error: configuration: expected a mapping of keys, got 'x\\x80\\xa5", 0), 0u)
      << r.err;
  EXPECT_NE(r.err.find("...' (401 bytes)\n"), std::string::npos) << r.err;
  for (const char c : r.err) EXPECT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << static_cast<int>(c);
  EXPECT_FALSE(fs::exists(dir + "/out"));
}

// CLI11's own errors are one line with exit status 2; help still exits 0.
TEST(CliBadInputFiles, CommandLineErrorsAreOneLineWithExitStatusTwo) {
  const auto unknown = run_cli("train --bogus");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_EQ(unknown.err, "gradaccum: error: The following argument was not expected: --bogus (see gradaccum --help)\n");
  const auto none = run_cli("");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_EQ(none.err, "gradaccum: error: A subcommand is required (see gradaccum --help)\n");
  for (const char* args : {"train --nproc two", "verify --steps", "plot", "plan --global-batch -5",
                           "plan --global-batch 0", "verify --tolerance inf",
                           "generate --checkpoint c --prompt p "
                           "--temperature nan",
                           "eval --checkpoint c f --threads 100000"}) {
    const auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("gradaccum: error: ", 0), 0u) << r.err;
  }
  EXPECT_EQ(run_cli("plan --global-batch -5").err,
            "gradaccum: error: --global-batch: must be >= 1, got -5 (see gradaccum --help)\n");
  EXPECT_EQ(run_cli("verify --tolerance inf").err,
            "gradaccum: error: --tolerance: must be a finite number, got inf (see gradaccum --help)\n");
  EXPECT_NE(run_cli("eval --checkpoint c f --threads 100000")
                .err.find("--threads: must be in [0, max(1024, 4 x cores)] (0 = all cores); at most "),
            std::string::npos);
  EXPECT_EQ(run_cli("--help").exit_code, 0);
}

TEST(CliBadInputFiles, CorruptDatasetFileIsNamed) {
  const auto dir = make_temp_dir("corrupt-data");
  // Valid labels, truncated images.
  fs::copy_file("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz", dir + "/train-labels-idx1-ubyte.gz");
  std::ofstream(dir + "/train-images-idx3-ubyte.gz", std::ios::binary) << std::string("\x00\x00\x08\x03\x00", 5);
  const auto r = run_cli("train --set data.directory=" + dir + " --set output_dir=" + dir + "/out");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(dir + "/train-images-idx3-ubyte.gz: truncated or corrupt IDX file"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/out"));
  fs::remove_all(dir);
}

}  // namespace cli_test

namespace cli_test {

const std::string kVerify =
    "verify --set model.channels=[4,8] --set model.hidden=[16] --set data.train_limit=256 --set threads=2 "
    "--steps 3 --splits 32x1,8x4";

TEST(CliVerify, ExactWithGroupNormAndNotWithBatchNorm) {
  const auto group = run_cli(kVerify);
  EXPECT_EQ(group.exit_code, 0) << group.out << group.err;
  EXPECT_NE(group.out.find("exact: every split follows the full-batch trajectory"), std::string::npos) << group.out;
  const auto batch = run_cli(kVerify + " --set model.norm=batch");
  EXPECT_EQ(batch.exit_code, 1);
  EXPECT_NE(batch.out.find("DIFFERS"), std::string::npos) << batch.out;
  // The naive normalization is exact for equal micro-batches but not with the
  // uneven 256 = 3 x 80 + 16 windows of 80 = 16 x 5 vs 80 x 1.
  const auto naive = run_cli(
      "verify --set model.channels=[4,8] --set model.hidden=[16] --set data.train_limit=256 "
      "--set threads=2 --steps 4 --splits 80x1,16x5 --set loss_normalization=micro_batch");
  EXPECT_EQ(naive.exit_code, 1) << naive.out;
  const auto bad = run_cli("verify --splits 64x1,20x3");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(
      bad.err,
      "gradaccum: error: --splits: 20x3 is a global batch of 60, 64x1 one of 64: compare splits of the same batch\n");
  // Both products wrap to 0 in int64 (then equal, and a division by zero followed).
  const auto wraps = run_cli("verify --splits 4611686018427387904x4,2305843009213693952x8");
  EXPECT_EQ(wraps.exit_code, 1);
  EXPECT_EQ(wraps.err,
            "gradaccum: error: --splits: '4611686018427387904x4': per_device_train_batch_size 4611686018427387904 x "
            "gradient_accumulation_steps 4 x world size 1 is more than the largest global batch, 2^53 = "
            "9007199254740992 samples\n");
}

}  // namespace cli_test
