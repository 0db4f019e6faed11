// A checkpoint is whole or absent across ranks: a rank lost between its part and the manifest
// publishes nothing and `auto` picks the checkpoint before; a disk that fills up during a save
// is one line naming the file, earlier checkpoints stay intact, and save_on_error decides
// whether the run stops or goes on without that checkpoint.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "gradaccum/base/check.h"
#include "gradaccum/io/checkpoint.h"
#include "small_tmpfs.h"
#include "test_support.h"

namespace checkpoint_faults_test {

using gradaccum::testing::make_temp_dir;
using gradaccum::testing::read_text;
using gradaccum::testing::run_cli;
namespace fs = std::filesystem;
namespace io = gradaccum::io;

io::CheckpointContents contents_at(int64_t step) {
  io::CheckpointContents c;
  c.state.position.step = c.state.position.schedule_step = step;
  c.model = {{"weight", torch::full({4}, static_cast<double>(step), torch::kDouble)}};
  c.optimizer = gradaccum::formats::NamedTensors{};
  c.run_id = "00000000000000aa";
  return c;
}

bool has_temporaries(const std::string& root) {
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.path().filename().string().rfind(".tmp-", 0) == 0) return true;
  }
  return false;
}

// Rank 0's view of a two-rank save: `all_ok` is the collective that tells it whether its peer
// wrote its part. The peer dies after step 1 is published and before it answers for step 2.
TEST(CheckpointFaults, ARankLostBetweenItsPartAndTheManifestPublishesNothing) {
  const auto dir = make_temp_dir("ckpt-torn");
  io::write_run_id(dir, "00000000000000aa");
  int calls = 0;
  io::CheckpointStoreOptions options;
  options.output_dir = dir;
  options.world_size = 2;
  options.all_ok = [&calls](bool ok) {
    // Save 1 makes three agreements; save 2 passes its first and loses the peer at its second.
    if (++calls == 5) throw gradaccum::Error("rank 0: the checkpoint barrier failed, a peer rank died");
    return ok;
  };
  io::CheckpointStore store(options);
  EXPECT_EQ(store.save(contents_at(1)), dir + "/checkpoints/step-1");
  EXPECT_EQ(calls, 3);
  try {
    store.save(contents_at(2));
    FAIL() << "a save whose peer was lost returned";
  } catch (const gradaccum::Error& e) {
    EXPECT_STREQ(e.what(), "rank 0: the checkpoint barrier failed, a peer rank died");
  }
  EXPECT_FALSE(fs::exists(dir + "/checkpoints/step-2"));
  const auto choice = io::choose_checkpoint("auto", dir);
  EXPECT_EQ(choice.directory, dir + "/checkpoints/step-1");
  EXPECT_EQ(io::read_checkpoint(choice.directory, 0).model.at(0).second[0].item<double>(), 1.0);
  // What the lost save left is dropped by the next store (a restarted run).
  EXPECT_TRUE(has_temporaries(dir + "/checkpoints"));
  io::CheckpointStore restarted(options);
  EXPECT_FALSE(has_temporaries(dir + "/checkpoints"));

  // A peer that could not write its part (its disk full): every rank throws CheckpointNotSaved and
  // rank 0 removes the unpublished directory.
  calls = 0;
  io::CheckpointStoreOptions refusing = options;
  refusing.all_ok = [&calls](bool ok) { return ++calls == 2 ? false : ok; };
  io::CheckpointStore store2(refusing);
  try {
    store2.save(contents_at(3));
    FAIL() << "a save that a peer could not write returned";
  } catch (const io::CheckpointNotSaved& e) {
    EXPECT_EQ(std::string(e.what()), "checkpoint " + dir +
                                         "/checkpoints/step-3 not saved: another rank could not write its part (its "
                                         "own error says why)");
  }
  EXPECT_FALSE(fs::exists(dir + "/checkpoints/step-3"));
  EXPECT_FALSE(has_temporaries(dir + "/checkpoints"));
  EXPECT_EQ(io::choose_checkpoint("auto", dir).directory, dir + "/checkpoints/step-1");
  fs::remove_all(dir);
}

// Bytes a directory's files take on tmpfs (whole pages).
uintmax_t pages_of(const std::string& dir) {
  uintmax_t total = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) total += (entry.file_size() + 4095) / 4096 * 4096;
  }
  return total;
}

// Checkpoints at steps 3 and 6 and at the end (8) of a 1.6 MB MLP; the disk holds one checkpoint
// and the final model but not a second checkpoint beside the first.
const std::string kRun =
    "train --set model.type=mlp --set model.hidden=[512] --set data.train_limit=256 --set data.eval_limit=-1 "
    "--set max_steps=8 --set save_steps=3 --set threads=1 --set per_device_train_batch_size=16 "
    "--set global_batch_size=32";

TEST(CheckpointFaults, ADiskThatFillsUpStopsTheRunOrGoesOnWithoutThatCheckpoint) {
  const auto sizing = make_temp_dir("ckpt-disk-sizing");
  const auto r = run_cli(kRun + " --set output_dir=" + sizing);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const uintmax_t checkpoint = pages_of(sizing + "/checkpoints/step-3");
  const uintmax_t final_model = pages_of(sizing + "/final");
  const uintmax_t capacity = checkpoint + final_model + 256 * 1024;
  ASSERT_LT(capacity, 2 * checkpoint) << "the sizes no longer make the second checkpoint fail";
  fs::remove_all(sizing);

  struct Case {
    std::string name, flags;
    bool continues;
  };
  for (const auto& c : std::vector<Case>{{"stop", "", false},
                                         {"stop-two-ranks-zero1", " --nproc 2 --set zero_stage=1", false},
                                         {"continue", " --set save_on_error=continue", true}}) {
    SCOPED_TRACE(c.name);
    const gradaccum::testing::SmallTmpfs disk("ckpt-disk-" + c.name, std::to_string(capacity));
    if (disk.path().empty()) GTEST_SKIP() << disk.why();
    const auto out = disk.path() + "/run";
    const auto run = run_cli(kRun + c.flags + " --set output_dir=" + out);
    const std::string step6 = "checkpoint " + out + "/checkpoints/step-6 not saved: ";
    EXPECT_NE(run.err.find(step6), std::string::npos) << run.err;
    EXPECT_NE(run.err.find("No space left on device"), std::string::npos) << run.err;
    // The checkpoint before is whole, nothing half-written is left.
    EXPECT_EQ(io::read_checkpoint(out + "/checkpoints/step-3", 0).state.position.step, 3);
    EXPECT_FALSE(fs::exists(out + "/checkpoints/step-6"));
    EXPECT_FALSE(has_temporaries(out + "/checkpoints"));
    if (c.continues) {
      EXPECT_EQ(run.exit_code, 0) << run.err;
      EXPECT_NE(run.err.find("; training goes on without it (save_on_error: continue)"), std::string::npos) << run.err;
      EXPECT_EQ(gradaccum::testing::step_records(out + "/metrics.jsonl").size(), 8u);
      EXPECT_TRUE(fs::exists(out + "/final/model.safetensors"));
      EXPECT_EQ(io::choose_checkpoint("auto", out).directory, out + "/checkpoints/step-3");
    } else {
      EXPECT_EQ(run.exit_code, 1) << run.err;
      EXPECT_EQ(gradaccum::testing::step_records(out + "/metrics.jsonl").size(), 6u);
      EXPECT_FALSE(fs::exists(out + "/final"));
      // Rank 0's line is the error's one line: no trace.
      const auto line = run.err.substr(run.err.find("gradaccum: error: " + step6));
      EXPECT_NE(line.find('\n'), std::string::npos);
      EXPECT_EQ(line.find("\n "), std::string::npos) << run.err;
    }
  }
}

}  // namespace checkpoint_faults_test
