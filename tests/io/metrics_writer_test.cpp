// metrics.jsonl and summary.json (io/metrics_writer.h) in process: the fields of a step
// record and which appear only when they apply, eval lines, summary.json from the run's
// geometry, and a resumed run keeping the lines up to its checkpoint's step.
#include "gradaccum/io/metrics_writer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "test_support.h"

namespace metrics_writer_test {

namespace core = gradaccum::core;
using gradaccum::io::MetricsWriter;

core::StepRecord record(int64_t step) {
  core::StepRecord r;
  r.step = step;
  r.epoch = 1;
  r.loss = 2.5 / static_cast<double>(step);
  r.lr = 1e-3;
  r.grad_norm = 3.0;
  r.grad_norm_clipped = 1.0;
  r.weight_norm = 7.25;
  r.items = 120;
  r.samples = 16;
  r.micro_steps = 4;
  r.items_per_s = 600.0;
  r.samples_per_s = 80.0;
  return r;
}

TEST(MetricsWriter, AStepRecordCarriesItsFiguresAndOnlyTheFieldsThatApply) {
  const auto plain = MetricsWriter::to_json(record(3), /*items_are_tokens=*/false);
  EXPECT_EQ(plain["step"], 3);
  EXPECT_EQ(plain["epoch"], 1);
  EXPECT_DOUBLE_EQ(plain["loss"].get<double>(), 2.5 / 3.0);
  EXPECT_DOUBLE_EQ(plain["grad_norm"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(plain["grad_norm_clipped"].get<double>(), 1.0);
  EXPECT_EQ(plain["items"], 120);
  EXPECT_EQ(plain["samples"], 16);
  EXPECT_EQ(plain["micro_steps"], 4);
  EXPECT_EQ(plain["skipped"], false);
  EXPECT_FALSE(plain.contains("tokens_per_s"));
  EXPECT_FALSE(plain.contains("loss_scale"));
  EXPECT_FALSE(plain.contains("world_size"));
  EXPECT_FALSE(plain.contains("micro_step_items"));
  EXPECT_FALSE(plain.contains("rank_items"));

  auto r = record(3);
  r.loss_scale = 512.0;
  r.world_size = 2;
  r.allreduce_calls = 3;
  r.allreduce_bytes = 4096;
  r.micro_step_items = {40, 25, 31, 24};
  r.rank_items = {70, 50};
  r.loss_normalization = "window";
  const auto full = MetricsWriter::to_json(r, /*items_are_tokens=*/true);
  EXPECT_EQ(full["micro_step_items"], (std::vector<int64_t>{40, 25, 31, 24}));
  EXPECT_EQ(full["micro_step_items_min"], 24);
  EXPECT_EQ(full["micro_step_items_max"], 40);
  EXPECT_EQ(full["rank_items"], (std::vector<int64_t>{70, 50}));
  EXPECT_EQ(full["loss_normalization"], "window");
  EXPECT_DOUBLE_EQ(full["tokens_per_s"].get<double>(), 600.0);
  EXPECT_DOUBLE_EQ(full["loss_scale"].get<double>(), 512.0);
  EXPECT_EQ(full["world_size"], 2);
  EXPECT_EQ(full["allreduce_calls"], 3);
  EXPECT_EQ(full["allreduce_bytes"], 4096);

  core::EvalRecord eval;
  eval.step = 3;
  eval.loss = 1.25;
  eval.samples = 10;
  eval.items = 90;
  EXPECT_FALSE(MetricsWriter::to_json(eval).contains("eval_accuracy"));  // not a classifier
  eval.accuracy = 0.5;
  const auto e = MetricsWriter::to_json(eval);
  EXPECT_DOUBLE_EQ(e["eval_loss"].get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(e["eval_accuracy"].get<double>(), 0.5);
  EXPECT_EQ(e["eval_items"], 90);
}

TEST(MetricsWriter, AResumedRunKeepsTheLinesUpToItsStepAndAppends) {
  const auto dir = gradaccum::testing::make_temp_dir("metrics-writer");
  {
    MetricsWriter writer(dir, true);
    writer.on_start({core::BatchGeometry::from_accumulation(4, 2, 2), 10, 5, 80, 0, 1234});
    for (int64_t s = 1; s <= 4; ++s) writer.on_step(record(s));
    core::EvalRecord eval;
    eval.step = 2;
    writer.on_eval(eval);
  }
  auto lines = gradaccum::testing::read_jsonl(dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_TRUE(lines[4].contains("eval_loss"));

  {
    MetricsWriter resumed(dir, true, /*resumed_at_step=*/2);
    resumed.on_start({core::BatchGeometry::from_accumulation(4, 2, 2), 10, 5, 80, 0, 1234});
    resumed.on_step(record(3));
    core::TrainSummary summary;
    summary.steps = 3;
    summary.samples = 48;
    summary.items_per_s = 600.0;
    resumed.on_end(summary);
  }
  lines = gradaccum::testing::read_jsonl(dir + "/metrics.jsonl");
  // Steps 1 and 2 and step 2's eval kept, steps 3 and 4 of the lost work dropped, step 3 again.
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_EQ(lines[1]["step"], 2);
  EXPECT_TRUE(lines[2].contains("eval_loss"));
  EXPECT_EQ(lines[3]["step"], 3);

  std::ifstream in(dir + "/summary.json");
  const auto summary = nlohmann::json::parse(in);
  EXPECT_EQ(summary["steps"], 3);
  EXPECT_EQ(summary["micro_batch"], 4);
  EXPECT_EQ(summary["gradient_accumulation_steps"], 2);
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_EQ(summary["global_batch_size"], 16);
  EXPECT_EQ(summary["parameters"], 1234);
  EXPECT_DOUBLE_EQ(summary["tokens_per_s"].get<double>(), 600.0);
  EXPECT_FALSE(std::filesystem::exists(dir + "/summary.json.tmp"));
  std::filesystem::remove_all(dir);
}

}  // namespace metrics_writer_test
