// metrics.jsonl and summary.json (io/metrics_writer.h) in process: the fields of a step
// record and which appear only when they apply, eval lines, summary.json from the run's
// geometry, and a resumed run keeping the lines up to its checkpoint's step.
#include "gradaccum/io/metrics_writer.h"

#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "small_tmpfs.h"
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
    // The summary counts the checkpoint's samples too (48); this process trained one step of 16
    // samples and 120 items in 0.2 s, and the throughput is over those.
    core::TrainSummary summary;
    summary.steps = 3;
    summary.samples = 48;
    summary.wall_s = 0.2;
    summary.samples_per_s = 240.0;
    summary.items_per_s = 1800.0;
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
  EXPECT_DOUBLE_EQ(summary["samples_per_s"].get<double>(), 80.0);
  EXPECT_DOUBLE_EQ(summary["tokens_per_s"].get<double>(), 600.0);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename().string().find("tmp"), std::string::npos) << entry.path();
  }
  std::filesystem::remove_all(dir);
}

using gradaccum::testing::SmallTmpfs;

// A full disk stops the run with one line naming metrics.jsonl, which ends after its last whole
// record (it used to stop at 4096 bytes, cut mid-record, while training went on).
TEST(MetricsWriter, AFullFilesystemStopsTheRunAndLeavesWholeRecords) {
  const SmallTmpfs disk("metrics-full", "16k");
  if (disk.path().empty()) GTEST_SKIP() << disk.why();
  const auto out = disk.path() + "/out";
  const auto r = gradaccum::testing::run_cli(
      "train --set model.type=mlp --set model.hidden=[8] --set data.train_limit=256 --set data.eval_limit=-1 "
      "--set per_device_train_batch_size=4 --set gradient_accumulation_steps=1 --set max_steps=60 "
      "--set grad_flow_steps=0 --set threads=1 --set output_dir=" +
      out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err, "gradaccum: error: " + out + "/metrics.jsonl: write failed: No space left on device\n");
  const auto text = gradaccum::testing::read_text(out + "/metrics.jsonl");
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  const auto lines = gradaccum::testing::read_jsonl(out + "/metrics.jsonl");  // each line parses
  ASSERT_FALSE(lines.empty());
  EXPECT_LT(lines.size(), 60u);
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i]["step"], i + 1);
  EXPECT_FALSE(std::filesystem::exists(out + "/final"));
}

}  // namespace metrics_writer_test
