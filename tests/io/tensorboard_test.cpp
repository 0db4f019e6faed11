// TensorBoard event files (formats/event_file.h, io/tensorboard_writer.h) read back by TensorBoard's
// own reader from the venv (tests/tensorboard/read_events.py): the record checksum, scalars and
// histograms written directly, every training scalar of a run against metrics.jsonl, and the
// errors of the configuration and of an unusable logging_dir.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "gradaccum/formats/event_file.h"
#include "test_support.h"

namespace tensorboard_test {

namespace fs = std::filesystem;
using gradaccum::testing::make_temp_dir;
using gradaccum::testing::read_jsonl;
using gradaccum::testing::run_cli;

// What TensorBoard's reader finds in `logdir` (read_events.py's JSON); fails the test when the
// reader cannot run.
nlohmann::json read_with_tensorboard(const std::string& logdir) {
  const std::string out = logdir + "/../read_events.json";
  const std::string script = std::string(GRADACCUM_TEST_DATA) + "/../tensorboard/read_events.py";
  const std::string command = "'" + gradaccum::testing::venv_program("python") + "' -B '" + script + "' '" + logdir +
                              "' '" + out + "' > '" + out + ".log' 2>&1";
  EXPECT_EQ(std::system(command.c_str()), 0) << "tensorboard's reader failed (tensorboard in the venv "
                                             << gradaccum::testing::venv_program("python") << "?):\n"
                                             << gradaccum::testing::read_text(out + ".log");
  std::ifstream in(out);
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json::object();
}

// TensorBoard stores scalars as float32.
void expect_float32_equal(double tensorboard, double expected, const std::string& what) {
  EXPECT_NEAR(tensorboard, expected, 1e-6 * std::abs(expected) + 1e-30) << what;
}

TEST(EventFile, MaskedCrc32cOfTheCheckString) {
  // CRC32C("123456789") = 0xE3069283, the Castagnoli polynomial's check value.
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(gradaccum::formats::masked_crc32c("123456789", 9), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  EXPECT_EQ(gradaccum::formats::masked_crc32c("", 0), ((0u >> 15) | (0u << 17)) + 0xa282ead8u);
}

TEST(EventFile, ScalarsAndHistogramsReadBackInTensorBoard) {
  const auto dir = make_temp_dir("tb-file");
  {
    gradaccum::formats::EventFile file(dir + "/logs");
    EXPECT_NE(fs::path(file.path()).filename().string().find("events.out.tfevents."), std::string::npos);
    for (int64_t step = 1; step <= 3; ++step) {
      file.write_scalars(step, {{"a/x", 0.5 * static_cast<double>(step)}, {"a/y", -1e-7 * static_cast<double>(step)}});
    }
    file.write_histogram(3, "h", {0.5, 1.0, 1e-3, -2.0, 0.0});
    file.flush();
  }
  const auto read = read_with_tensorboard(dir + "/logs");
  ASSERT_TRUE(read.contains("scalars"));
  ASSERT_EQ(read["scalars"]["a/x"].size(), 3u);
  ASSERT_EQ(read["scalars"]["a/y"].size(), 3u);
  for (int64_t step = 1; step <= 3; ++step) {
    EXPECT_EQ(read["scalars"]["a/x"][step - 1][0], step);
    expect_float32_equal(read["scalars"]["a/x"][step - 1][1], 0.5 * static_cast<double>(step), "a/x");
    expect_float32_equal(read["scalars"]["a/y"][step - 1][1], -1e-7 * static_cast<double>(step), "a/y");
  }
  ASSERT_EQ(read["histograms"]["h"].size(), 1u);
  const auto& h = read["histograms"]["h"][0];
  EXPECT_EQ(h[0], 3);
  EXPECT_EQ(h[1], -2.0);
  EXPECT_EQ(h[2], 1.0);
  EXPECT_EQ(h[3], 5.0);
  EXPECT_DOUBLE_EQ(h[4].get<double>(), 0.5 + 1.0 + 1e-3 - 2.0);
  EXPECT_DOUBLE_EQ(h[5].get<double>(), 0.25 + 1.0 + 1e-6 + 4.0);
  // Every value in its bucket (limit[i-1], limit[i]]: the counts total 5, and the bucket ending
  // at the first limit >= 1.0 holds 1.0.
  const auto limits = h[6].get<std::vector<double>>();
  const auto counts = h[7].get<std::vector<double>>();
  ASSERT_EQ(limits.size(), counts.size());
  double total = 0.0;
  for (double c : counts) total += c;
  EXPECT_EQ(total, 5.0);
  for (double v : {0.5, 1.0, 1e-3, -2.0, 0.0}) {
    size_t i = 0;
    while (limits[i] < v) ++i;
    EXPECT_GE(counts[i], 1.0) << "no count in the bucket of " << v;
    if (i > 0) EXPECT_LT(limits[i - 1], v);
  }
  fs::remove_all(dir);
}

// Every scalar TensorBoard reads equals the metrics.jsonl field it names (train/x: the step
// record's x, eval/x: the eval record's eval_x), at the same step; train scalars at every
// logging_steps-th step and the last; values metrics.jsonl writes as null (not finite) absent.
void expect_tensorboard_matches_metrics(const std::string& out, int64_t logging_steps,
                                        const std::set<std::string>& required_tags) {
  std::map<int64_t, nlohmann::json> steps, evals;
  int64_t last = 0;
  for (const auto& j : read_jsonl(out + "/metrics.jsonl")) {
    if (j.contains("loss")) {
      steps[j["step"].get<int64_t>()] = j;
      last = std::max(last, j["step"].get<int64_t>());
    } else if (j.contains("eval_loss")) {
      evals[j["step"].get<int64_t>()] = j;
    }
  }
  ASSERT_GT(last, 0);
  // grad_flow.jsonl: step -> parameter -> its statistics.
  std::map<int64_t, std::map<std::string, nlohmann::json>> flow;
  if (fs::exists(out + "/grad_flow.jsonl")) {
    for (const auto& j : read_jsonl(out + "/grad_flow.jsonl")) {
      for (const auto& p : j["parameters"]) flow[j["step"].get<int64_t>()][p["name"].get<std::string>()] = p;
    }
  }
  const auto read = read_with_tensorboard(out + "/runs");
  ASSERT_TRUE(read.contains("scalars"));
  for (const auto& tag : required_tags) EXPECT_TRUE(read["scalars"].contains(tag)) << tag;
  for (const auto& [tag, points] : read["scalars"].items()) {
    if (tag.rfind("grad_flow/", 0) == 0) {
      // grad_flow/<parameter>/<statistic>: the grad_flow.jsonl value, at each of its steps.
      const auto slash = tag.rfind('/');
      const std::string name = tag.substr(10, slash - 10), statistic = tag.substr(slash + 1);
      std::set<int64_t> expected_steps, seen;
      for (const auto& [step, parameters] : flow) {
        if (parameters.count(name) && !parameters.at(name)[statistic].is_null()) expected_steps.insert(step);
      }
      for (const auto& p : points) {
        const int64_t step = p[0].get<int64_t>();
        seen.insert(step);
        ASSERT_TRUE(flow.count(step) && flow.at(step).count(name)) << tag << " at step " << step;
        expect_float32_equal(p[1].get<double>(), flow.at(step).at(name)[statistic].get<double>(),
                             tag + " at step " + std::to_string(step));
      }
      EXPECT_EQ(seen, expected_steps) << tag;
      continue;
    }
    const bool train = tag.rfind("train/", 0) == 0;
    ASSERT_TRUE(train || tag.rfind("eval/", 0) == 0) << tag;
    const std::string key = train ? tag.substr(6) : "eval_" + tag.substr(5);
    const auto& records = train ? steps : evals;
    std::set<int64_t> expected_steps;
    for (const auto& [step, j] : records) {
      const bool logged = !train || step % logging_steps == 0 || step == last;
      if (logged && j.contains(key) && !j[key].is_null()) expected_steps.insert(step);
    }
    std::set<int64_t> seen;
    for (const auto& p : points) {
      const int64_t step = p[0].get<int64_t>();
      seen.insert(step);
      ASSERT_TRUE(records.count(step)) << tag << " at step " << step;
      expect_float32_equal(p[1].get<double>(), records.at(step)[key].get<double>(),
                           tag + " at step " + std::to_string(step));
    }
    EXPECT_EQ(seen, expected_steps) << tag;
  }
}

TEST(TensorBoardRun, ClassifierScalarsEqualMetricsJsonl) {
  const auto dir = make_temp_dir("tb-cnn");
  const auto r = run_cli(
      "train --set model.type=mlp --set model.hidden=[32] --set data.train_limit=300 --set data.eval_limit=100 "
      "--set max_steps=11 --set eval_steps=5 --set logging_steps=2 --set threads=2 --set report_to=[tensorboard] "
      "--set output_dir=" +
      dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_tensorboard_matches_metrics(
      dir + "/run", 2,
      {"train/loss", "train/lr", "train/grad_norm", "train/grad_norm_clipped", "train/weight_norm", "train/items",
       "train/samples_per_s", "train/epoch", "train/micro_step_items_min", "train/micro_step_items_max", "eval/loss",
       "eval/accuracy", "eval/items", "grad_flow/fc0.weight/mean_abs", "grad_flow/head.bias/zero_fraction"});
  // The histogram of mean |grad| across the 6 parameter tensors, at each gradient-flow step
  // (every logging_steps = 2: steps 2, 4, ..., 10).
  const auto read = read_with_tensorboard(dir + "/run/runs");
  const auto& histograms = read["histograms"]["grad_flow/mean_abs_across_parameters"];
  ASSERT_EQ(histograms.size(), 5u);
  EXPECT_EQ(histograms[0][0], 2);
  EXPECT_EQ(histograms[0][3], 6.0);
  fs::remove_all(dir);
}

// A language model under fp16: tokens per second, the loss scale, and a skipped first step whose
// gradient norm is not finite (an initial scale of 1e10 overflows float16; the backoff of 1e-6
// brings it to 1e4, which does not).
TEST(TensorBoardRun, LanguageModelUnderFp16ScalarsEqualMetricsJsonl) {
  const auto dir = make_temp_dir("tb-lm");
  const auto r = run_cli(
      "train --set model.type=gpt2 --set model.n_layer=1 --set model.n_embd=16 --set model.n_head=2 "
      "--set model.n_positions=32 --set data.type=kjv --set data.max_length=16 --set data.train_limit=96 "
      "--set data.eval_limit=-1 --set max_steps=3 --set threads=2 --set learning_rate=1e-2 --set seed=7 "
      "--set per_device_train_batch_size=8 --set gradient_accumulation_steps=4 --set mixed_precision=fp16 "
      "--set loss_scaler.init_scale=1e10 --set loss_scaler.backoff_factor=1e-6 "
      "--set report_to=tensorboard --set output_dir=" +
      dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto metrics = read_jsonl(dir + "/run/metrics.jsonl");
  ASSERT_FALSE(metrics.empty());
  EXPECT_TRUE(metrics[0]["skipped"].get<bool>()) << "the first fp16 step was expected to overflow";
  expect_tensorboard_matches_metrics(dir + "/run", 1,
                                     {"train/loss", "train/tokens_per_s", "train/loss_scale", "train/items"});
  fs::remove_all(dir);
}

TEST(TensorBoardRun, UnusableLoggingDirIsAOneLineErrorBeforeTraining) {
  const auto dir = make_temp_dir("tb-error");
  std::ofstream(dir + "/file") << "not a directory";
  const auto r = run_cli(
      "train --set model.type=mlp --set model.hidden=[8] --set data.train_limit=64 "
      "--set max_steps=2 --set report_to=tensorboard --set logging_dir=" +
      dir + "/file/logs --set output_dir=" + dir + "/run");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.err, "gradaccum: error: key 'logging_dir': cannot create " + dir + "/file/logs: " + dir +
                       "/file is not a directory\n");
  EXPECT_FALSE(fs::exists(dir + "/run")) << "output_dir was made before the check";
  fs::remove_all(dir);
}

TEST(TensorBoardRun, ReportToNamesOnlyKnownIntegrations) {
  const auto r = run_cli("train --set report_to=wandb --set output_dir=/nonexistent");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("key 'report_to': 'wandb' is not one of none | tensorboard"), std::string::npos) << r.err;
  const auto both = run_cli("train --set report_to=[none,tensorboard] --set output_dir=/nonexistent");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("'none' cannot be combined"), std::string::npos) << both.err;
}

}  // namespace tensorboard_test
