// data.type text_classification through the program: a tiny GPT-2 classifier trained on a CSV of
// named labels evaluates its stratified test split once into summary.json, on the same texts for
// another b × N and for two ranks (float64: the same test loss); the labels' names are
// final/config.json's id2label; `verify` finds a tiny Llama classifier's splits exact in float64;
// the movie reviews load as two classes; bad files are one line naming the file and line, with
// nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "test_support.h"

namespace text_classification_cli_test {

using gradaccum::testing::make_temp_dir;
using gradaccum::testing::read_text;
using gradaccum::testing::run_cli;
namespace fs = std::filesystem;

// 40 reviews, named labels, texts of 3 to 11 words (some with quoted commas and quotes), so
// micro-batches are padded differently.
std::string write_reviews(const std::string& dir) {
  const auto path = dir + "/reviews.csv";
  std::ofstream out(path, std::ios::binary);
  out << "sentiment,review\r\n";
  const char* good[] = {"good", "great", "fine", "lovely"};
  const char* bad[] = {"bad", "dull", "poor", "tedious"};
  for (int i = 0; i < 40; ++i) {
    const bool positive = i % 2 == 0;
    std::string text;
    for (int w = 0; w < 3 + (i * 5) % 9; ++w) text += std::string(w ? " " : "") + (positive ? good : bad)[(i + w) % 4];
    if (i % 3 == 0) text += ", \"\"really\"\"";
    out << (positive ? "positive" : "negative") << ",\"" << text << "\"\r\n";
  }
  return path;
}

const std::string kTinyGpt2 =
    "--set model.type=gpt2 --set model.n_layer=1 --set model.n_embd=16 --set model.n_head=2 "
    "--set model.n_positions=32 --set data.type=text_classification --set data.max_length=12 "
    "--set data.text_field=review --set data.label_field=sentiment --set threads=2 --set learning_rate=1e-2 "
    "--set seed=7";

// The console's "data: ..." line.
std::string data_line(const std::string& out) {
  const auto at = out.find("\ndata: ");
  return at == std::string::npos ? "" : out.substr(at + 1, out.find('\n', at + 1) - at - 1);
}

TEST(TextClassificationCli, TrainsAndEvaluatesItsTestSplitOnceTheSameForEveryDecomposition) {
  const auto dir = make_temp_dir("text-cls-train");
  const auto csv = write_reviews(dir);
  const auto run = "train " + kTinyGpt2 + " --set data.path=" + csv +
                   " --set data.eval_fraction=0.1 --set data.test_fraction=0.2 --set dtype=float64 --set max_steps=3";
  const auto a = run_cli(
      run + " --set per_device_train_batch_size=4 --set gradient_accumulation_steps=2 --set output_dir=" + dir + "/a");
  ASSERT_EQ(a.exit_code, 0) << a.out << a.err;
  const auto b = run_cli(
      run + " --set per_device_train_batch_size=1 --set gradient_accumulation_steps=8 --set output_dir=" + dir + "/b");
  ASSERT_EQ(b.exit_code, 0) << b.out << b.err;
  // Two ranks: each evaluates the test split, rank 0 writes it.
  const auto c = run_cli(run +
                         " --set per_device_train_batch_size=2 --set gradient_accumulation_steps=2 --set threads=1 "
                         "--nproc 2 --set output_dir=" +
                         dir + "/c");
  ASSERT_EQ(c.exit_code, 0) << c.out << c.err;
  EXPECT_EQ(data_line(a.out), "data: " + csv +
                                  ": 40 labelled texts, 2 classes (\"negative\", \"positive\"); per class: train 28 "
                                  "(14 / 14), eval 4 (2 / 2), test 8 (4 / 4); 5 truncated to 12 tokens (their end cut)")
      << a.out;
  EXPECT_EQ(data_line(b.out), data_line(a.out));

  const auto summary_a = nlohmann::json::parse(read_text(dir + "/a/summary.json"));
  const auto summary_b = nlohmann::json::parse(read_text(dir + "/b/summary.json"));
  EXPECT_EQ(summary_a["steps"], 3);
  EXPECT_EQ(summary_a["test_samples"], 8);
  EXPECT_EQ(summary_a["eval_samples"], 4);
  const double accuracy = summary_a["test_accuracy"].get<double>();
  EXPECT_GE(accuracy, 0.0);
  EXPECT_LE(accuracy, 1.0);
  EXPECT_EQ(accuracy * 8, std::round(accuracy * 8));  // a count of the 8 test reviews
  EXPECT_TRUE(std::isfinite(summary_a["test_loss"].get<double>()));
  // The same test texts, and the same model after the same windows.
  EXPECT_LE(gradaccum::testing::relative_difference(summary_b["test_loss"].get<double>(),
                                                    summary_a["test_loss"].get<double>()),
            1e-10);
  EXPECT_EQ(summary_b["test_accuracy"], summary_a["test_accuracy"]);
  const auto summary_c = nlohmann::json::parse(read_text(dir + "/c/summary.json"));
  EXPECT_EQ(summary_c["test_samples"], 8);
  EXPECT_LE(gradaccum::testing::relative_difference(summary_c["test_loss"].get<double>(),
                                                    summary_a["test_loss"].get<double>()),
            1e-10);
  EXPECT_EQ(summary_c["test_accuracy"], summary_a["test_accuracy"]);
  EXPECT_NE(a.out.find("\ntest split: loss "), std::string::npos) << a.out;
  // The evaluations during training scored the validation split, and say so.
  EXPECT_NE(a.out.find("\nvalidation accuracy: "), std::string::npos) << a.out;
  EXPECT_EQ(a.out.find("\ntest accuracy: "), std::string::npos) << a.out;
  // Evaluated once: metrics.jsonl holds no test record.
  EXPECT_EQ(read_text(dir + "/a/metrics.jsonl").find("test_"), std::string::npos);

  const auto config = nlohmann::json::parse(read_text(dir + "/a/final/config.json"));
  EXPECT_EQ(config["architectures"][0], "GPT2ForSequenceClassification");
  EXPECT_EQ(config["id2label"], nlohmann::json({{"0", "negative"}, {"1", "positive"}}));
  EXPECT_EQ(config["label2id"], nlohmann::json({{"negative", 0}, {"positive", 1}}));
  fs::remove_all(dir);
}

TEST(TextClassificationCli, VerifyFindsALlamaClassifiersSplitsExactInFloat64) {
  const auto dir = make_temp_dir("text-cls-verify");
  const auto csv = write_reviews(dir);
  const auto r = run_cli("verify --splits 8x1,2x4,1x8 --steps 3 " + kTinyGpt2 +
                         " --set model.type=llama --set model.n_layer=2 --set model.n_embd=24 --set model.n_head=6 "
                         "--set model.n_kv_head=2 --set model.intermediate_size=40 --set data.path=" +
                         csv + " --set data.test_fraction=0.2");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("exact: every split follows the full-batch trajectory"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(TextClassificationCli, TheMovieReviewsLoadAsTwoClasses) {
  const std::string reviews = "/var/lib/gradaccum/data/movie-reviews/reviews.csv";
  ASSERT_TRUE(fs::exists(reviews)) << reviews << " is missing: run scripts/setup.sh";
  const auto dir = make_temp_dir("text-cls-reviews");
  const auto r = run_cli("train " + kTinyGpt2 + " --set data.path=" + reviews +
                         " --set data.text_field=1 --set data.label_field=0 --set data.labels=name "
                         "--set data.eval_fraction=0.0666666666666667 --set data.test_fraction=0.1333333333333333 "
                         "--set data.train_limit=8 --set per_device_train_batch_size=4 "
                         "--set gradient_accumulation_steps=2 --set max_steps=1 --set output_dir=" +
                         dir + "/run");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(data_line(r.out).rfind("data: " + reviews +
                                       ": 1500 labelled texts, 2 classes (\"-1\", \"1\"); per class: train 1200 "
                                       "(600 / 600), eval 100 (50 / 50), test 200 (100 / 100); ",
                                   0),
            0u)
      << r.out;
  const auto summary = nlohmann::json::parse(read_text(dir + "/run/summary.json"));
  EXPECT_EQ(summary["test_samples"], 200);
  const auto config = nlohmann::json::parse(read_text(dir + "/run/final/config.json"));
  EXPECT_EQ(config["id2label"], nlohmann::json({{"0", "-1"}, {"1", "1"}}));
  fs::remove_all(dir);
}

// Bad input through the program: one line naming the file and line, exit 1, nothing written.
TEST(TextClassificationCli, BadFilesAreOneLineAndWriteNothing) {
  const auto dir = make_temp_dir("text-cls-bad");
  std::ofstream(dir + "/columns.csv") << "review,sentiment\ngood,positive\n\"bad, really\",negative,extra\n";
  std::ofstream(dir + "/quote.csv") << "review,sentiment\n\"good,positive\nbad,negative\n";
  std::ofstream(dir + "/labels.jsonl") << "{\"review\": \"good\", \"sentiment\": 0}\n"
                                       << "{\"review\": \"bad\", \"sentiment\": 1000000000000000}\n";
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"--set data.path=" + dir + "/columns.csv", dir + "/columns.csv:3: 3 fields where the header (line 1) has 2"},
      {"--set data.path=" + dir + "/quote.csv",
       dir + "/quote.csv:2: a quoted field opened on this line is never closed"},
      {"--set data.path=" + dir + "/labels.jsonl",
       dir + "/labels.jsonl:2: label 1000000000000000 is not a class index below the 2 labelled texts"},
      {"--set data.path=" + dir + "/columns.csv --set data.eval_fraction=0.5 --set data.test_fraction=0.5",
       "keys 'data.eval_fraction' and 'data.test_fraction': 0.5 + 0.5 leave nothing to train on"},
      {"", "key 'data.path': data.type text_classification needs a file"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const auto out = dir + "/out" + std::to_string(i++);
    const auto r = run_cli("train " + kTinyGpt2 + " " + c.args + " --set output_dir=" + out, "", "ulimit -v 4194304");
    EXPECT_EQ(r.exit_code, 1) << c.args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.rfind("gradaccum: error: " + c.message, 0), 0u) << c.args << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
  fs::remove_all(dir);
}

}  // namespace text_classification_cli_test
