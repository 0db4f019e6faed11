// Checkpoints: resuming reproduces an uninterrupted run bit for bit (on one
// machine and thread count), inside a window too; SIGTERM saves and exits 0;
// SIGKILL loses at most the work since the last checkpoint; a corrupt
// checkpoint is a one-line error, not a crash.
#include "gradaccum/io/checkpoint.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/inotify.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "gradaccum/core/trainer.h"
#include "gradaccum/models/model_factory.h"
#include "gradaccum/models/module_tensors.h"
#include "gradaccum/models/tasks.h"
#include "gradaccum/optim/optimizer_factory.h"
#include "gradaccum/optim/optimizer_state.h"
#include "stop_inside_window.h"
#include "test_support.h"

extern char** environ;

namespace checkpoint_test {

using gradaccum::testing::make_temp_dir;
using gradaccum::testing::read_jsonl;
using gradaccum::testing::read_text;
using gradaccum::testing::run_cli;
namespace fs = std::filesystem;
namespace core = gradaccum::core;

// A small MLP on 300 Fashion-MNIST images: 64 per step gives 4 full windows
// and a partial one of 44 per epoch, so 20 steps cross epochs and partial windows.
const std::string kRun =
    "--set model.type=mlp --set model.hidden=[32] --set data.train_limit=300 "
    "--set data.eval_limit=100 --set max_steps=20 --set threads=2 --set learning_rate=3e-3 "
    "--set warmup_steps=3";

// The fields of a step record that must agree bit for bit (not the times).
void expect_same_steps(const std::vector<nlohmann::json>& a, const std::vector<nlohmann::json>& b, int64_t from_step,
                       int64_t to_step) {
  auto steps = [](const std::vector<nlohmann::json>& lines, int64_t from, int64_t to) {
    std::vector<nlohmann::json> out;
    for (const auto& l : lines) {
      if (l.contains("loss") && l["step"].get<int64_t>() >= from && l["step"].get<int64_t>() <= to) {
        out.push_back(l);
      }
    }
    return out;
  };
  const auto x = steps(a, from_step, to_step);
  const auto y = steps(b, from_step, to_step);
  ASSERT_EQ(x.size(), static_cast<size_t>(to_step - from_step + 1));
  ASSERT_EQ(y.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    for (const char* key : {"step", "epoch", "loss", "grad_norm", "grad_norm_clipped", "lr", "items", "samples",
                            "weight_norm", "micro_steps", "micro_step_items", "loss_normalization"}) {
      EXPECT_EQ(x[i][key], y[i][key]) << "step " << x[i]["step"] << " key " << key;
    }
  }
}

std::string run_ok(const std::string& args) {
  const auto r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.out;
}

TEST(CheckpointResume, ResumedRunEqualsUninterruptedBitForBit) {
  const auto dir = make_temp_dir("ckpt-resume");
  run_ok("train " + kRun + " --set save_steps=6 --set output_dir=" + dir + "/straight");
  for (int k : {6, 12, 18, 20}) {
    EXPECT_TRUE(fs::exists(dir + "/straight/checkpoints/step-" + std::to_string(k) + "/manifest.json")) << k;
  }
  const auto straight = read_jsonl(dir + "/straight/metrics.jsonl");

  // Step 12 is window 2 of epoch 2 (5 windows per epoch, the last partial).
  const auto out = run_ok("train " + kRun + " --set output_dir=" + dir + "/resumed " +
                          "--set resume_from_checkpoint=" + dir + "/straight/checkpoints/step-12");
  EXPECT_NE(out.find("resuming from"), std::string::npos);
  const auto resumed = read_jsonl(dir + "/resumed/metrics.jsonl");
  expect_same_steps(straight, resumed, 13, 20);
  // The final weights are the same bytes.
  EXPECT_EQ(read_text(dir + "/straight/final/model.safetensors"), read_text(dir + "/resumed/final/model.safetensors"));

  // Resuming into the same directory keeps steps 1..12 and redoes the rest:
  // the file then reads as one uninterrupted run.
  run_ok("train " + kRun + " --set save_steps=6 --set output_dir=" + dir + "/straight " +
         "--set resume_from_checkpoint=" + dir + "/straight/checkpoints/step-12");
  expect_same_steps(straight, read_jsonl(dir + "/straight/metrics.jsonl"), 1, 20);
  fs::remove_all(dir);
}

TEST(CheckpointResume, OtherDecompositionOfTheSameGlobalBatchStaysExactFloat64) {
  const auto dir = make_temp_dir("ckpt-decomp");
  const auto run = kRun + " --set dtype=float64 ";
  run_ok("train " + run + " --set save_steps=10 --set output_dir=" + dir + "/a");
  run_ok("train " + run + " --set per_device_train_batch_size=4 --set gradient_accumulation_steps=16 " +
         "--set output_dir=" + dir + "/b --set resume_from_checkpoint=" + dir + "/a/checkpoints/step-10");
  const auto a = read_jsonl(dir + "/a/metrics.jsonl");
  const auto b = read_jsonl(dir + "/b/metrics.jsonl");
  int compared = 0;
  for (const auto& x : a) {
    for (const auto& y : b) {
      if (!x.contains("loss") || !y.contains("loss") || x["step"] != y["step"]) continue;
      EXPECT_NEAR(y["loss"].get<double>(), x["loss"].get<double>(), 1e-10 * x["loss"].get<double>());
      EXPECT_NEAR(y["grad_norm"].get<double>(), x["grad_norm"].get<double>(), 1e-10 * x["grad_norm"].get<double>());
      EXPECT_EQ(y["micro_steps"].get<int64_t>() > x["micro_steps"].get<int64_t>(), true);
      ++compared;
    }
  }
  EXPECT_EQ(compared, 10);
  fs::remove_all(dir);
}

TEST(CheckpointResume, TwoRanksResumeBitIdenticallyAlsoWithZero1) {
  const auto dir = make_temp_dir("ckpt-w2");
  for (const std::string zero : {"0", "1"}) {
    const auto run = kRun + " --set threads=1 --set per_device_train_batch_size=8 --nproc 2 --set zero_stage=" + zero;
    const auto a = dir + "/a" + zero;
    run_ok("train " + run + " --set max_steps=8 --set save_steps=4 --set output_dir=" + a);
    if (zero == "1") {
      // Each rank saved its own optimizer shard.
      EXPECT_TRUE(fs::exists(a + "/checkpoints/step-4/optimizer-rank1.safetensors"));
    }
    run_ok("train " + run + " --set max_steps=8 --set output_dir=" + dir + "/b" + zero +
           " --set resume_from_checkpoint=" + a + "/checkpoints/step-4");
    expect_same_steps(read_jsonl(a + "/metrics.jsonl"), read_jsonl(dir + "/b" + zero + "/metrics.jsonl"), 5, 8);
  }
  fs::remove_all(dir);
}

// ZeRO-2 and ZeRO-3 at a window's end: each rank saves its optimizer shards (the gradient shards
// are empty there; under ZeRO-3 the weights are gathered whole for the checkpoint), and the
// resumed run repeats the uninterrupted one bit for bit, for both policies, final weights included.
TEST(CheckpointResume, TwoRanksResumeBitIdenticallyWithZero2And3ForBothPolicies) {
  const auto dir = make_temp_dir("ckpt-zero23");
  for (const std::string zero : {"2", "3"}) {
    for (const std::string policy : {"defer", "each_micro_step"}) {
      SCOPED_TRACE("zero_stage " + zero + " " + policy);
      const auto run = kRun +
                       " --set threads=1 --set per_device_train_batch_size=8 --set gradient_accumulation_steps=2 "
                       "--nproc 2 --set zero_stage=" +
                       zero + " --set sharded_grad_sync=" + policy;
      const auto a = dir + "/a" + zero + "-" + policy, b = dir + "/b" + zero + "-" + policy;
      run_ok("train " + run + " --set max_steps=8 --set save_steps=4 --set output_dir=" + a);
      EXPECT_TRUE(fs::exists(a + "/checkpoints/step-4/optimizer-rank1.safetensors"));
      run_ok("train " + run + " --set max_steps=8 --set output_dir=" + b + " --set resume_from_checkpoint=" + a +
             "/checkpoints/step-4");
      const auto resumed = read_jsonl(b + "/metrics.jsonl");
      expect_same_steps(read_jsonl(a + "/metrics.jsonl"), resumed, 5, 8);
      for (const auto& record : resumed) {
        if (record.contains("loss")) EXPECT_EQ(record["sharded_grad_sync"], policy);
      }
      EXPECT_EQ(read_text(a + "/final/model.safetensors"), read_text(b + "/final/model.safetensors"));
    }
  }
  fs::remove_all(dir);
}

// A checkpoint resumed at another world size or zero stage: the optimizer state is joined from
// the saved shards and cut for this run's layout (dist/optimizer_reshard.h), and the steps after
// it follow the uninterrupted run as another decomposition of the same batch does (float64).
TEST(CheckpointResume, AnotherWorldSizeOrZeroStageReshardsTheOptimizerStateFloat64) {
  const auto dir = make_temp_dir("ckpt-reshard");
  const auto run = kRun +
                   " --set dtype=float64 --set threads=1 --set global_batch_size=32 --set max_steps=8 "
                   "--set save_steps=4";
  const auto zero2 = dir + "/w2-zero2";
  run_ok("train " + run +
         " --set per_device_train_batch_size=8 --nproc 2 --set zero_stage=2 --set output_dir=" + zero2);
  const auto whole = dir + "/w1";
  run_ok("train " + run + " --set per_device_train_batch_size=8 --set output_dir=" + whole);
  const auto reference = read_jsonl(whole + "/metrics.jsonl");
  struct Case {
    std::string name, flags, from, note;
  };
  for (const auto& c :
       std::vector<Case>{{"w1-from-w2", "--set per_device_train_batch_size=8", zero2,
                          "saved in 2 shards, resharded to this run's "
                          "layout (whole)"},
                         {"w4-zero1-from-w2", "--set per_device_train_batch_size=4 --nproc 4 --set zero_stage=1", zero2,
                          "saved in 2 shards, resharded to this run's layout (in 4 shards)"},
                         {"w2-zero2-from-w1", "--set per_device_train_batch_size=8 --nproc 2 --set zero_stage=2", whole,
                          "saved whole, resharded to this run's layout (in 2 shards)"},
                         {"w4-zero3-from-w2-zero2", "--set per_device_train_batch_size=4 --nproc 4 --set zero_stage=3",
                          zero2, "saved in 2 shards, resharded to this run's layout (in 4 shards)"},
                         {"w2-zero3-from-w1", "--set per_device_train_batch_size=8 --nproc 2 --set zero_stage=3", whole,
                          "saved whole, resharded to this run's layout (in 2 shards)"}}) {
    SCOPED_TRACE(c.name);
    const auto r = run_cli("train " + run + " " + c.flags + " --set output_dir=" + dir + "/" + c.name +
                           " --set resume_from_checkpoint=" + c.from + "/checkpoints/step-4");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("optimizer state: " + c.note), std::string::npos) << r.err;
    int compared = 0;
    for (const auto& y : read_jsonl(dir + "/" + c.name + "/metrics.jsonl")) {
      if (!y.contains("loss")) continue;
      for (const auto& x : reference) {
        if (!x.contains("loss") || x["step"] != y["step"]) continue;
        EXPECT_NEAR(y["loss"].get<double>(), x["loss"].get<double>(), 1e-10 * x["loss"].get<double>());
        EXPECT_NEAR(y["grad_norm"].get<double>(), x["grad_norm"].get<double>(), 1e-10 * x["grad_norm"].get<double>());
        EXPECT_NEAR(y["weight_norm"].get<double>(), x["weight_norm"].get<double>(),
                    1e-10 * x["weight_norm"].get<double>());
        ++compared;
      }
    }
    EXPECT_EQ(compared, 4);
  }
  fs::remove_all(dir);
}

TEST(CheckpointResume, AnotherGlobalBatchIsRefusedUnlessAllowed) {
  const auto dir = make_temp_dir("ckpt-batch");
  run_ok("train " + kRun + " --set max_steps=4 --set output_dir=" + dir + "/a");
  const auto resume =
      " --set output_dir=" + dir + "/b --set resume_from_checkpoint=" + dir + "/a/checkpoints/step-4 --set max_steps=8";
  const auto refused = run_cli("train " + kRun + " --set gradient_accumulation_steps=2" + resume);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("it was saved with global batch 64 and this run has 32"), std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("allow_batch_change=true"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/b"));
  const auto allowed =
      run_cli("train " + kRun + " --set gradient_accumulation_steps=2 --set allow_batch_change=true" + resume);
  EXPECT_EQ(allowed.exit_code, 0) << allowed.err;
  // Step 4 ended 4 x 64 = 256 samples into epoch 0: with 32 per step that is window 8.
  const auto b = read_jsonl(dir + "/b/metrics.jsonl");
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b.front()["step"], 5);
  EXPECT_EQ(b.front()["samples"], 32);
  fs::remove_all(dir);
}

// A process started in the background, for signals: the program, or `wrapper` (a command such as
// "timeout 600") running it; with `own_group`, the leader of a process group of its own (whose id
// is its pid).
struct Child {
  pid_t pid = -1;
  explicit Child(const std::string& args, const std::string& log, const std::string& wrapper = "",
                 bool own_group = false) {
    const std::string command =
        "exec " + wrapper + " '" + std::string(GRADACCUM_CLI) + "' " + args + " > '" + log + "' 2>&1";
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    if (own_group) {
      posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
      posix_spawnattr_setpgroup(&attributes, 0);
    }
    EXPECT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, &attributes, const_cast<char**>(argv), environ), 0);
    posix_spawnattr_destroy(&attributes);
  }
  int wait() {
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return status;
  }
  ~Child() {
    if (pid > 0) {
      kill(-pid, SIGKILL);  // its group, where it leads one
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// The pid of a child process of `parent`, or -1.
pid_t child_of(pid_t parent) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const auto name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto stat = read_text(entry.path().string() + "/stat");
    const auto close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream fields(stat.substr(close_paren + 2));
    std::string state;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid == parent) return std::stoi(name);
  }
  return -1;
}

// Waits until metrics.jsonl holds `lines` lines (or the child ended).
void wait_for_lines(const std::string& path, size_t lines, pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(path) && read_jsonl(path).size() >= lines) return;
    if (waitpid(pid, nullptr, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Windows of 16 micro-steps of 4: a SIGTERM almost always lands inside one.
const std::string kLongWindows = kRun + " --set per_device_train_batch_size=4 --set gradient_accumulation_steps=16";

TEST(CheckpointSignals, SigtermSavesAndExitsZeroThenResumesBitIdentically) {
  const auto dir = make_temp_dir("ckpt-sigterm");
  run_ok("train " + kLongWindows + " --set output_dir=" + dir + "/straight");
  {
    Child child("train " + kLongWindows + " --set output_dir=" + dir + "/stopped", dir + "/log");
    wait_for_lines(dir + "/stopped/metrics.jsonl", 3, child.pid);
    kill(child.pid, SIGTERM);
    const int status = child.wait();
    ASSERT_TRUE(WIFEXITED(status)) << read_text(dir + "/log");
    EXPECT_EQ(WEXITSTATUS(status), 0) << read_text(dir + "/log");
  }
  EXPECT_NE(read_text(dir + "/log").find("resume with: --set resume_from_checkpoint=latest"), std::string::npos);
  run_ok("train " + kLongWindows + " --set output_dir=" + dir + "/stopped --set resume_from_checkpoint=latest");
  expect_same_steps(read_jsonl(dir + "/straight/metrics.jsonl"), read_jsonl(dir + "/stopped/metrics.jsonl"), 1, 20);
  EXPECT_EQ(read_text(dir + "/straight/final/model.safetensors"), read_text(dir + "/stopped/final/model.safetensors"));
  fs::remove_all(dir);
}

// One stop request that reaches the process as several copies: GNU timeout, itself sent a
// SIGTERM, passes it to its child and then to the child's process group, and a supervisor's copy
// follows 100 ms later. The copies count once: the run saves, exits 0 and resumes exactly.
TEST(CheckpointSignals, CopiesOfOneRequestThroughTimeoutSaveAndResumeExactly) {
  const auto dir = make_temp_dir("ckpt-sigterm-copies");
  run_ok("train " + kLongWindows + " --set output_dir=" + dir + "/straight");
  {
    Child child("train " + kLongWindows + " --set output_dir=" + dir + "/stopped", dir + "/log", "timeout 600");
    wait_for_lines(dir + "/stopped/metrics.jsonl", 3, child.pid);
    const pid_t program = child_of(child.pid);
    ASSERT_GT(program, 0);
    kill(child.pid, SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kill(program, SIGTERM);
    const int status = child.wait();
    ASSERT_TRUE(WIFEXITED(status)) << read_text(dir + "/log");
    EXPECT_EQ(WEXITSTATUS(status), 0) << read_text(dir + "/log");
  }
  EXPECT_NE(read_text(dir + "/log").find("resume with: --set resume_from_checkpoint=latest"), std::string::npos)
      << read_text(dir + "/log");
  run_ok("train " + kLongWindows + " --set output_dir=" + dir + "/stopped --set resume_from_checkpoint=latest");
  expect_same_steps(read_jsonl(dir + "/straight/metrics.jsonl"), read_jsonl(dir + "/stopped/metrics.jsonl"), 1, 20);
  EXPECT_EQ(read_text(dir + "/straight/final/model.safetensors"), read_text(dir + "/stopped/final/model.safetensors"));
  fs::remove_all(dir);
}

// Two ranks with windows of 16 micro-steps of 4 samples each. The CNN makes a
// step take long enough (~0.1 s) for a signal sent after step 3 to land in
// training rather than after the run's end.
const std::string kTwoRanks = kRun +
                              " --set model.type=cnn --set threads=1 --set per_device_train_batch_size=4"
                              " --set gradient_accumulation_steps=16 --nproc 2";

// SIGTERM to a two-rank job (the launcher, which passes it to both ranks, or
// rank 1 alone: rank 0 then learns it through the store) once it has logged 3
// steps; it must save and exit 0. Returns the checkpoint's micro-steps of rank
// 0 and rank 1: 0 when the stop came too late for the window in flight and
// was carried to its end.
std::pair<int64_t, int64_t> sigterm_two_ranks(const std::string& out, bool to_rank1_only,
                                              const std::string& extra = "") {
  const auto log = out + ".log";
  Child child("train " + kTwoRanks + extra + " --set output_dir=" + out, log);
  wait_for_lines(out + "/metrics.jsonl", 3, child.pid);
  const pid_t target = to_rank1_only ? gradaccum::testing::rank_pid(child.pid, 1) : child.pid;
  EXPECT_GT(target, 0);
  if (target > 0) kill(target, SIGTERM);
  const int status = child.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_text(log);
  const auto checkpoint = gradaccum::io::resolve_checkpoint("latest", out);
  return {gradaccum::io::read_checkpoint(checkpoint, 0).state.position.micro_step,
          gradaccum::io::read_checkpoint(checkpoint, 1).state.position.micro_step};
}

// Each rank stops after its micro-step in flight and saves its own partial
// window; resuming continues bit-identically. A signal that lands while a rank
// is already in a window's last micro-step stops the job at the window's end
// instead: then the attempt is repeated, so that the in-window path is what
// gets checked (each attempt lands there with high probability).
void expect_two_rank_preemption_inside_a_window(const std::string& name, bool to_rank1_only,
                                                const std::string& extra = "") {
  const auto dir = make_temp_dir(name);
  run_ok("train " + kTwoRanks + extra + " --set output_dir=" + dir + "/straight");
  std::string out;
  std::pair<int64_t, int64_t> micro_steps{0, 0};
  for (int attempt = 0; attempt < 6 && micro_steps.first == 0; ++attempt) {
    out = dir + "/stopped" + std::to_string(attempt);
    micro_steps = sigterm_two_ranks(out, to_rank1_only, extra);
  }
  ASSERT_GT(micro_steps.first, 0);
  ASSERT_GT(micro_steps.second, 0);
  ASSERT_LT(micro_steps.first, 16);
  ASSERT_LT(micro_steps.second, 16);
  const auto resumed =
      run_ok("train " + kTwoRanks + extra + " --set output_dir=" + out + " --set resume_from_checkpoint=latest");
  EXPECT_NE(resumed.find(fmt::format("micro-step {})", micro_steps.first)), std::string::npos) << resumed;
  expect_same_steps(read_jsonl(dir + "/straight/metrics.jsonl"), read_jsonl(out + "/metrics.jsonl"), 1, 20);
  EXPECT_EQ(read_text(dir + "/straight/final/model.safetensors"), read_text(out + "/final/model.safetensors"));
  fs::remove_all(dir);
}

TEST(CheckpointSignals, TwoRanksStopInsideAWindowAndResumeBitIdentically) {
  expect_two_rank_preemption_inside_a_window("ckpt-sigterm-w2", /*to_rank1_only=*/false);
}

TEST(CheckpointSignals, SigtermToOneRankStopsBothInsideAWindow) {
  expect_two_rank_preemption_inside_a_window("ckpt-sigterm-rank1", /*to_rank1_only=*/true);
}

// ZeRO-2 deferring: the partial window's sums are in .grad, saved and put back as without sharding.
TEST(CheckpointSignals, TwoRanksWithZero2DeferStopInsideAWindowAndResumeBitIdentically) {
  expect_two_rank_preemption_inside_a_window("ckpt-sigterm-zero2", /*to_rank1_only=*/false,
                                             " --set zero_stage=2 --set sharded_grad_sync=defer");
}

// ZeRO-3 deferring: the partial window's sums are in .grad too, the weights gathered for the save.
TEST(CheckpointSignals, TwoRanksWithZero3DeferStopInsideAWindowAndResumeBitIdentically) {
  expect_two_rank_preemption_inside_a_window("ckpt-sigterm-zero3", /*to_rank1_only=*/false,
                                             " --set zero_stage=3 --set sharded_grad_sync=defer");
}

// ZeRO-2 reducing every micro-step keeps the partial sums in its shard: the stop waits for the
// window's end, and the resumed run repeats the uninterrupted one bit for bit.
TEST(CheckpointSignals, TwoRanksWithZero2EachMicroStepStopAtTheWindowsEndAndResumeBitIdentically) {
  const auto dir = make_temp_dir("ckpt-sigterm-zero2-each");
  const std::string zero2 = " --set zero_stage=2 --set sharded_grad_sync=each_micro_step";
  run_ok("train " + kTwoRanks + zero2 + " --set output_dir=" + dir + "/straight");
  const auto out = dir + "/stopped";
  EXPECT_EQ(sigterm_two_ranks(out, /*to_rank1_only=*/false, zero2), (std::pair<int64_t, int64_t>{0, 0}));
  run_ok("train " + kTwoRanks + zero2 + " --set output_dir=" + out + " --set resume_from_checkpoint=latest");
  expect_same_steps(read_jsonl(dir + "/straight/metrics.jsonl"), read_jsonl(out + "/metrics.jsonl"), 1, 20);
  EXPECT_EQ(read_text(dir + "/straight/final/model.safetensors"), read_text(out + "/final/model.safetensors"));
  fs::remove_all(dir);
}

// A window stopped inside on two ranks, resumed by one process (an elastic restart at a smaller
// W, with global_batch_size fixed so that N follows): its partial sums do not fit 4 x 32 x 1, so
// the window is trained again from its first micro-step, and the run follows the uninterrupted
// two-rank one (float64: another decomposition of the same global batch).
TEST(CheckpointSignals, AStopInsideAWindowResumesAtAnotherWorldSizeByTrainingThatWindowAgain) {
  const auto dir = make_temp_dir("ckpt-sigterm-other-w");
  const std::string f64 = " --set dtype=float64";
  run_ok("train " + kTwoRanks + f64 + " --set output_dir=" + dir + "/straight");
  std::string out;
  std::pair<int64_t, int64_t> micro_steps{0, 0};
  for (int attempt = 0; attempt < 6 && micro_steps.first == 0; ++attempt) {
    out = dir + "/stopped" + std::to_string(attempt);
    micro_steps = sigterm_two_ranks(out, /*to_rank1_only=*/false, f64);
  }
  ASSERT_GT(micro_steps.first, 0);
  const auto resumed = run_ok("train " + kRun + f64 +
                              " --set model.type=cnn --set threads=1 --set per_device_train_batch_size=4 "
                              "--set global_batch_size=128 --set resume_from_checkpoint=latest --set output_dir=" +
                              out);
  EXPECT_NE(resumed.find(fmt::format("the window was saved at micro-step {} of 4x16x2 (b x N x W) and this run is "
                                     "4x32x1: it is trained again from its first micro-step",
                                     micro_steps.first)),
            std::string::npos)
      << resumed;
  const auto straight = read_jsonl(dir + "/straight/metrics.jsonl");
  size_t compared = 0;
  for (const auto& y : read_jsonl(out + "/metrics.jsonl")) {
    if (!y.contains("loss")) continue;
    ASSERT_LT(compared, straight.size());
    const auto& x = straight[compared];
    ASSERT_EQ(x["step"], y["step"]);
    for (const char* key : {"loss", "grad_norm", "weight_norm"}) {
      EXPECT_NEAR(y[key].get<double>(), x[key].get<double>(), 1e-10 * std::abs(x[key].get<double>()))
          << key << " step " << y["step"];
    }
    EXPECT_EQ(y["samples"], x["samples"]);
    ++compared;
  }
  EXPECT_EQ(compared, 20u);
  fs::remove_all(dir);
}

// resume_from_checkpoint=auto: a fresh start where output_dir's run has no checkpoint (as a worker
// that torchrun starts for the first time), the latest one where it has: the same command twice
// gives the run that one uninterrupted command gives.
TEST(CheckpointResume, AutoStartsAfreshThenContinuesTheLatest) {
  const auto dir = make_temp_dir("ckpt-auto");
  run_ok("train " + kRun + " --set output_dir=" + dir + "/straight");
  const auto first = run_cli("train " + kRun + " --set save_steps=6 --set output_dir=" + dir +
                             "/auto --set resume_from_checkpoint=auto");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.err.find("resume_from_checkpoint=auto: no checkpoint of this run under " + dir +
                           "/auto/checkpoints; a fresh start"),
            std::string::npos)
      << first.err;
  EXPECT_EQ(first.out.find("resuming from"), std::string::npos);
  // As if the run had been lost after step 12's checkpoint.
  for (const char* gone : {"checkpoints/step-18", "checkpoints/step-20", "final"})
    fs::remove_all(dir + "/auto/" + gone);
  const auto second = run_ok("train " + kRun + " --set save_steps=6 --set output_dir=" + dir +
                             "/auto --set resume_from_checkpoint=auto");
  EXPECT_NE(second.find("resuming from " + dir + "/auto/checkpoints/step-12 at step 12"), std::string::npos) << second;
  expect_same_steps(read_jsonl(dir + "/straight/metrics.jsonl"), read_jsonl(dir + "/auto/metrics.jsonl"), 1, 20);
  // auto keeps to a fresh start's rules: output_dir now names another run, whose start would mix
  // its checkpoints with this one's.
  gradaccum::io::write_run_id(dir + "/auto", "00000000000000ff");
  const auto refused =
      run_cli("train " + kRun + " --set output_dir=" + dir + "/auto --set resume_from_checkpoint=auto");
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("holds checkpoints of an earlier run"), std::string::npos) << refused.err;
  fs::remove_all(dir);
}

// A `--nproc 2` job sent one SIGTERM that reaches each rank twice: directly and through the
// launcher's forwarding. Once under GNU timeout (signalled itself: it signals the launcher, then
// the whole process group) and once by a kill of the job's process group. Each time the job
// saves, exits 0, and resumes exactly.
TEST(CheckpointSignals, TwoRanksSignalledThroughTimeoutAndTheirProcessGroupSaveAndResumeExactly) {
  const auto dir = make_temp_dir("ckpt-sigterm-group");
  run_ok("train " + kTwoRanks + " --set output_dir=" + dir + "/straight");
  for (const bool through_timeout : {true, false}) {
    const auto out = dir + (through_timeout ? "/timeout" : "/group");
    {
      Child child("train " + kTwoRanks + " --set output_dir=" + out, out + ".log", through_timeout ? "timeout 600" : "",
                  /*own_group=*/!through_timeout);
      wait_for_lines(out + "/metrics.jsonl", 3, child.pid);
      kill(through_timeout ? child.pid : -child.pid, SIGTERM);
      const int status = child.wait();
      ASSERT_TRUE(WIFEXITED(status)) << read_text(out + ".log");
      EXPECT_EQ(WEXITSTATUS(status), 0) << read_text(out + ".log");
    }
    ASSERT_TRUE(fs::exists(gradaccum::io::resolve_checkpoint("latest", out) + "/manifest.json"))
        << read_text(out + ".log");
    run_ok("train " + kTwoRanks + " --set output_dir=" + out + " --set resume_from_checkpoint=latest");
    expect_same_steps(read_jsonl(dir + "/straight/metrics.jsonl"), read_jsonl(out + "/metrics.jsonl"), 1, 20);
    EXPECT_EQ(read_text(dir + "/straight/final/model.safetensors"), read_text(out + "/final/model.safetensors"));
  }
  fs::remove_all(dir);
}

TEST(CheckpointSignals, SigkillAtARandomPointLosesOnlyWorkSinceTheLastCheckpoint) {
  const auto dir = make_temp_dir("ckpt-sigkill");
  const auto run = kRun + " --set save_steps=2 --set save_total_limit=2";
  run_ok("train " + run + " --set output_dir=" + dir + "/straight");
  std::random_device random;
  const size_t lines = 4 + random() % 12;  // somewhere in steps 4..15, maybe mid-save
  {
    Child child("train " + run + " --set output_dir=" + dir + "/killed", dir + "/log");
    wait_for_lines(dir + "/killed/metrics.jsonl", lines, child.pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(random() % 200));
    kill(child.pid, SIGKILL);
    child.wait();
  }
  // A save cut short leaves only a .tmp directory, which `latest` ignores.
  fs::create_directories(dir + "/killed/checkpoints/.tmp-step-99");
  std::ofstream(dir + "/killed/checkpoints/.tmp-step-99/model.safetensors") << "half";
  const auto out = run_ok("train " + run + " --set output_dir=" + dir + "/killed --set resume_from_checkpoint=latest");
  EXPECT_NE(out.find("resuming from"), std::string::npos) << "killed after " << lines << " lines";
  EXPECT_FALSE(fs::exists(dir + "/killed/checkpoints/.tmp-step-99"));
  expect_same_steps(read_jsonl(dir + "/straight/metrics.jsonl"), read_jsonl(dir + "/killed/metrics.jsonl"), 1, 20);
  EXPECT_EQ(read_text(dir + "/straight/final/model.safetensors"), read_text(dir + "/killed/final/model.safetensors"));
  // save_total_limit=2 kept the newest two.
  int kept = 0;
  for (const auto& e : fs::directory_iterator(dir + "/killed/checkpoints"))
    kept += e.path().filename().string().rfind("step-", 0) == 0;
  EXPECT_EQ(kept, 2);
  fs::remove_all(dir);
}

class CheckpointCorruption : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = make_temp_dir("ckpt-corrupt");
    run_ok("train " + kRun + " --set max_steps=2 --set output_dir=" + dir_ + "/run");
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // A copy of the good checkpoint to damage.
  std::string copy(const std::string& name) {
    const auto target = dir_ + "/" + name;
    fs::remove_all(target);
    fs::copy(dir_ + "/run/checkpoints/step-2", target, fs::copy_options::recursive);
    return target;
  }
  static void expect_error(const std::string& checkpoint, const std::string& message) {
    const auto out = dir_ + "/out-" + std::to_string(counter_++);
    const auto r = run_cli("train " + kRun + " --set max_steps=4 --set output_dir=" + out +
                           " --set resume_from_checkpoint=" + checkpoint);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
  static inline std::string dir_;
  static inline int counter_ = 0;
};

TEST_F(CheckpointCorruption, TruncatedFileIsCaughtByItsSize) {
  const auto c = copy("truncated");
  fs::resize_file(c + "/model.safetensors", fs::file_size(c + "/model.safetensors") / 2);
  expect_error(c, "model.safetensors has");
  expect_error(c, "(truncated or corrupt)");
}

TEST_F(CheckpointCorruption, FlippedByteIsCaughtByItsChecksum) {
  const auto c = copy("flipped");
  std::fstream f(c + "/optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(100);
  char byte = 0;
  f.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x40);
  f.seekp(100);
  f.write(&byte, 1);
  f.close();
  expect_error(c, "optimizer.safetensors fails its CRC-32 check (corrupt)");
}

// A checkpoint of an older format (before 5: the trainer's state field by field, not by piece) is
// refused in one line that names its version and the one this build reads.
TEST_F(CheckpointCorruption, OlderFormatVersionIsRefusedByName) {
  const auto c = copy("format-4");
  auto manifest = nlohmann::json::parse(read_text(c + "/manifest.json"));
  EXPECT_EQ(manifest.at("format_version"), 5);
  manifest["format_version"] = 4;
  std::ofstream(c + "/manifest.json") << manifest.dump(2);
  expect_error(c,
               "manifest.json: format version 4 is not supported (this build reads version 5 "
               "only; versions before 5 keep the trainer's state outside trainer_state.json's pieces)");
}

// CRC-32 (IEEE, zlib's), as the manifest records it.
uint32_t crc32_of(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const unsigned char byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// trainer_state.json of `checkpoint` with `edit` applied, the manifest updated to match: a
// checkpoint that passes every size and CRC check.
void edit_trainer_state(const std::string& checkpoint, const std::function<void(nlohmann::json&)>& edit) {
  auto state = nlohmann::json::parse(read_text(checkpoint + "/trainer_state.json"));
  edit(state);
  const auto text = state.dump(2) + "\n";
  std::ofstream(checkpoint + "/trainer_state.json") << text;
  auto manifest = nlohmann::json::parse(read_text(checkpoint + "/manifest.json"));
  manifest["files"]["trainer_state.json"] = {{"bytes", text.size()}, {"crc32", crc32_of(text)}};
  std::ofstream(checkpoint + "/manifest.json") << manifest.dump(2);
}

// `edit` applied to its position: a checkpoint that claims what no run reaches.
void edit_position(const std::string& checkpoint, const std::function<void(nlohmann::json&)>& edit) {
  edit_trainer_state(checkpoint, [&](nlohmann::json& state) { edit(state["position"]); });
}

// The step-2 checkpoint has trained 2 windows of 64 samples (128 samples, epoch 0).
TEST_F(CheckpointCorruption, ImpossibleEpochOrSamplesInTrainerStateAreRefused) {
  const auto unchanged = copy("unchanged");
  edit_position(unchanged, [](nlohmann::json&) {});
  const auto resumed = run_cli("train " + kRun + " --set max_steps=3 --set output_dir=" + dir_ +
                               "/resumed --set resume_from_checkpoint=" + unchanged);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;  // the edit itself is sound

  const auto epoch = copy("epoch");
  edit_position(epoch, [](nlohmann::json& p) { p["epoch"] = 999999; });
  expect_error(epoch, "trainer_state.json: epoch 999999 is impossible after 2 windows of 64 samples");
  const auto negative = copy("negative-samples");
  edit_position(negative, [](nlohmann::json& p) { p["samples"] = -5; });
  expect_error(negative, "trainer_state.json: negative position");
  const auto samples = copy("samples");
  edit_position(samples, [](nlohmann::json& p) { p["samples"] = 1000000; });
  expect_error(samples, "trainer_state.json: samples 1000000 is more than 3 windows of 64 samples hold");
  const auto window = copy("window");
  edit_position(window, [](nlohmann::json& p) { p["window"] = 7; });
  expect_error(window, "trainer_state.json: window 7 is beyond the 2 windows trained");
}

// The pieces' state goes through the files by name (io knows none of its fields): every kind of
// scalar and a tensor come back exactly; a field that is missing or of another kind is one line
// naming the file and the field.
TEST(CheckpointPieces, EveryKindOfFieldSurvivesWriteAndRead) {
  const auto dir = make_temp_dir("ckpt-pieces");
  gradaccum::io::CheckpointStore store({dir});
  gradaccum::io::CheckpointContents contents;
  contents.state.position.step = contents.state.position.schedule_step = 3;
  auto& piece = contents.state.piece("example");
  piece.set_integer("least", std::numeric_limits<int64_t>::min());
  piece.set_integer("most", std::numeric_limits<int64_t>::max());
  piece.set_real("tenth", 0.1);
  piece.set_real("subnormal", 5e-324);
  piece.set_real("whole", 65536.0);  // stays a real
  piece.set_flag("on", true);
  piece.set_flag("off", false);
  piece.set_text("label", "b \u00d7 N \"quoted\"\n");
  const auto sums = torch::tensor({0.1, -0.0, 1e300}, torch::kDouble);
  piece.set_tensor("sums", sums);
  piece.set_tensor("steps", torch::full({2, 2}, std::numeric_limits<int64_t>::max(), torch::kLong));
  contents.model = {{"weight", torch::ones({2})}};
  contents.optimizer = gradaccum::formats::NamedTensors{};
  const auto checkpoint = store.save(contents);

  const auto loaded = gradaccum::io::read_checkpoint(checkpoint, 0);
  ASSERT_EQ(loaded.state.pieces.count("example"), 1u);
  const auto& back = loaded.state.pieces.at("example");
  EXPECT_EQ(back.scalars, piece.scalars);
  ASSERT_EQ(back.tensors.size(), 2u);
  EXPECT_EQ(back.tensors.at("sums").scalar_type(), torch::kDouble);
  EXPECT_TRUE(torch::equal(back.tensors.at("sums"), sums));
  EXPECT_TRUE(std::signbit(back.tensors.at("sums")[1].item<double>()));
  EXPECT_TRUE(torch::equal(back.tensors.at("steps"), piece.tensors.at("steps")));
  EXPECT_EQ(loaded.state.scalars_file, checkpoint + "/trainer_state.json");
  EXPECT_EQ(loaded.state.tensors_file, checkpoint + "/window-rank0.safetensors");
  const auto pieces = nlohmann::json::parse(read_text(checkpoint + "/trainer_state.json"))["pieces"];
  EXPECT_EQ(pieces["example"]["on"], true);

  const auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const gradaccum::Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const auto read_least = [&] {
    gradaccum::io::read_checkpoint(checkpoint, 0).state.saved_piece("example").integer("least");
  };
  edit_trainer_state(checkpoint, [](nlohmann::json& s) { s["pieces"]["example"].erase("least"); });
  EXPECT_EQ(error_of(read_least), checkpoint + "/trainer_state.json: missing field 'example.least'");
  edit_trainer_state(checkpoint, [](nlohmann::json& s) { s["pieces"]["example"]["least"] = "-1"; });
  EXPECT_EQ(error_of(read_least),
            checkpoint + "/trainer_state.json: field 'example.least' has the wrong type (an integer expected)");
  edit_trainer_state(checkpoint, [](nlohmann::json& s) { s["pieces"]["example"]["least"] = {1, 2}; });
  EXPECT_EQ(error_of(read_least), checkpoint +
                                      "/trainer_state.json: field 'pieces.example.least' is not an int64, a number, "
                                      "true/false or a string");
  edit_trainer_state(checkpoint, [](nlohmann::json& s) { s["pieces"]["example"]["least"] = uint64_t{1} << 63; });
  EXPECT_NE(error_of(read_least).find("field 'pieces.example.least' is not an int64"), std::string::npos);
  edit_trainer_state(checkpoint, [](nlohmann::json& s) { s.erase("pieces"); });
  EXPECT_EQ(error_of(read_least), checkpoint + "/trainer_state.json: missing field 'pieces'");
  fs::remove_all(dir);
}

TEST_F(CheckpointCorruption, MissingManifestMissingFileAndNoCheckpoint) {
  const auto a = copy("no-manifest");
  fs::remove(a + "/manifest.json");
  expect_error(a, "no manifest.json");
  const auto b = copy("no-model");
  fs::remove(b + "/model.safetensors");
  expect_error(b, "model.safetensors is missing");
  expect_error(dir_ + "/nowhere", "is not a directory");
  const auto r = run_cli("train " + kRun + " --set output_dir=" + dir_ + "/empty --set resume_from_checkpoint=latest");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("latest: no complete checkpoint under"), std::string::npos) << r.err;
}

TEST_F(CheckpointCorruption, CheckpointOfAnotherModelIsNamed) {
  const auto r = run_cli("train " + kRun + " --set model.hidden=[16] --set max_steps=4 --set output_dir=" + dir_ +
                         "/other --set resume_from_checkpoint=" + dir_ + "/run/checkpoints/step-2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("has shape [32, 784], the model expects [16, 784]"), std::string::npos) << r.err;
}

// A reused output_dir: a fresh run there is refused while it holds checkpoints, unless
// overwrite_output_dir; then `latest` considers only the new run's checkpoints (each records its
// run's id) and says what newer ones it passes over.
TEST(CheckpointOutputDir, AReusedOutputDirIsRefusedAndLatestKeepsToItsOwnRun) {
  const auto dir = make_temp_dir("ckpt-reused");
  const auto out = dir + "/out";
  run_ok("train " + kRun + " --set max_steps=4 --set output_dir=" + out);
  const auto old_config = read_text(out + "/config.yaml");
  const auto old_metrics = read_text(out + "/metrics.jsonl");

  const auto refused = run_cli("train " + kRun + " --set max_steps=2 --set output_dir=" + out);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_EQ(refused.err, "gradaccum: error: output_dir " + out + ": it holds checkpoints of an earlier run (" + out +
                             "/checkpoints/step-4); continue that run with resume_from_checkpoint=latest, or set "
                             "overwrite_output_dir=true to start a new one there\n");
  EXPECT_EQ(read_text(out + "/config.yaml"), old_config);
  EXPECT_EQ(read_text(out + "/metrics.jsonl"), old_metrics);

  // A new run of 2 steps in the same directory, allowed; the old run's step-4 stays.
  run_ok("train " + kRun + " --set max_steps=2 --set overwrite_output_dir=true --set output_dir=" + out);
  ASSERT_TRUE(fs::exists(out + "/checkpoints/step-4/manifest.json"));
  const auto old_id = gradaccum::io::read_checkpoint(out + "/checkpoints/step-4", 0).run_id;
  const auto new_id = gradaccum::io::read_checkpoint(out + "/checkpoints/step-2", 0).run_id;
  EXPECT_EQ(new_id.size(), 16u);
  EXPECT_NE(old_id, new_id);
  EXPECT_EQ(gradaccum::io::read_run_id(out), new_id);
  // A step-6 directory without its manifest (a copy cut short), newer than both.
  fs::create_directories(out + "/checkpoints/step-6");

  // `latest` resumes the new run at its step 2 (and goes on to 4), not the old run's step 4.
  const auto resumed =
      run_cli("train " + kRun + " --set max_steps=4 --set output_dir=" + out + " --set resume_from_checkpoint=latest");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resuming from " + out + "/checkpoints/step-2 at step 2"), std::string::npos)
      << resumed.out;
  EXPECT_NE(resumed.err.find("resume_from_checkpoint=latest: " + out +
                             "/checkpoints/step-6 has no manifest.json (a save that did not finish, or a damaged "
                             "copy); passing over it"),
            std::string::npos)
      << resumed.err;
  EXPECT_NE(
      resumed.err.find("resume_from_checkpoint=latest: " + out + "/checkpoints/step-4 is of another run (run id " +
                       old_id + "; " + out + "/run.json names run " + new_id + "); passing over it"),
      std::string::npos)
      << resumed.err;
  const auto steps = gradaccum::testing::step_records(out + "/metrics.jsonl");
  ASSERT_EQ(steps.size(), 4u);
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i]["step"], i + 1);
  // The resumed run saved its own step-4 over the old run's, under its own id.
  EXPECT_EQ(gradaccum::io::read_checkpoint(out + "/checkpoints/step-4", 0).run_id, new_id);
  fs::remove_all(dir);
}

// Nothing is written until every check that bad input can fail has passed: a resume refused for
// another model leaves config.yaml and metrics.jsonl as they were, and a logging_dir that cannot be
// made is reported before output_dir exists.
TEST(CheckpointOutputDir, ARefusedRunLeavesTheOutputsAsTheyWere) {
  const auto dir = make_temp_dir("ckpt-refused");
  const auto out = dir + "/out";
  run_ok("train " + kRun + " --set max_steps=2 --set output_dir=" + out);
  std::map<std::string, std::string> before;
  for (const auto& entry : fs::recursive_directory_iterator(out)) {
    if (entry.is_regular_file()) before[entry.path().string()] = read_text(entry.path().string());
  }
  const auto other_model =
      run_cli("train " + kRun + " --set model.hidden=[16] --set max_steps=4 --set output_dir=" + out +
              " --set resume_from_checkpoint=latest");
  EXPECT_EQ(other_model.exit_code, 1);
  EXPECT_NE(other_model.err.find("has shape [32, 784], the model expects [16, 784]"), std::string::npos)
      << other_model.err;
  std::map<std::string, std::string> after;
  for (const auto& entry : fs::recursive_directory_iterator(out)) {
    if (entry.is_regular_file()) after[entry.path().string()] = read_text(entry.path().string());
  }
  EXPECT_EQ(after.size(), before.size());
  for (const auto& [path, text] : before) EXPECT_TRUE(after.count(path) && after[path] == text) << path;

  std::ofstream(dir + "/a-file") << "not a directory";
  const auto bad_logging_dir = run_cli("train " + kRun + " --set max_steps=2 --set report_to=tensorboard --set " +
                                       "logging_dir=" + dir + "/a-file/runs --set output_dir=" + dir + "/fresh");
  EXPECT_EQ(bad_logging_dir.exit_code, 1);
  EXPECT_EQ(bad_logging_dir.err, "gradaccum: error: key 'logging_dir': cannot create " + dir + "/a-file/runs: " + dir +
                                     "/a-file is not a directory\n");
  EXPECT_FALSE(fs::exists(dir + "/fresh"));
  fs::remove_all(dir);
}

// SIGKILL during the final save, as soon as its first file or directory appears in output_dir:
// final/ is whole or absent (published as a checkpoint is), and the next run's start removes what
// the save left. That run resumes at the last step: it trains nothing and shows no throughput.
TEST(CheckpointFinalSave, AKillDuringTheFinalSaveLeavesNoHalfModelBehind) {
  const auto dir = make_temp_dir("ckpt-final-kill");
  const auto out = dir + "/out";
  const auto run = kRun + " --set max_steps=4";
  run_ok("train " + run + " --set output_dir=" + dir + "/straight");
  {
    Child child("train " + run + " --set output_dir=" + out, dir + "/log");
    // Watch output_dir for the final save's first entry (the run makes output_dir first).
    while (!fs::exists(out) && waitpid(child.pid, nullptr, WNOHANG) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const int watch = inotify_init1(IN_CLOEXEC);
    ASSERT_GE(watch, 0);
    ASSERT_GE(inotify_add_watch(watch, out.c_str(), IN_CREATE | IN_MOVED_TO), 0);
    bool killed = false;
    alignas(inotify_event) char buffer[4096];
    while (!killed) {
      pollfd p{watch, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) {
        if (waitpid(child.pid, nullptr, WNOHANG) == child.pid) break;  // done before we saw it
        continue;
      }
      const auto n = read(watch, buffer, sizeof(buffer));
      for (ssize_t at = 0; at < n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
        if (event->len > 0 && std::string(event->name).find("final") != std::string::npos) {
          kill(child.pid, SIGKILL);
          killed = true;
        }
        at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      }
    }
    close(watch);
    ASSERT_TRUE(killed) << "the run ended before its final save was seen";
    child.wait();
  }
  if (fs::exists(out + "/final")) {
    EXPECT_EQ(read_text(out + "/final/model.safetensors"), read_text(dir + "/straight/final/model.safetensors"));
  }
  const auto resumed = run_cli("train " + run + " --set output_dir=" + out + " --set resume_from_checkpoint=latest");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("done: 4 steps, 256 samples (all trained before the checkpoint this run resumed)"),
            std::string::npos)
      << resumed.out;
  EXPECT_EQ(nlohmann::json::parse(read_text(out + "/summary.json"))["samples_per_s"], 0.0);
  EXPECT_EQ(read_text(out + "/final/model.safetensors"), read_text(dir + "/straight/final/model.safetensors"));
  for (const auto& entry : fs::recursive_directory_iterator(out)) {
    EXPECT_EQ(entry.path().filename().string().find("tmp"), std::string::npos) << entry.path();
  }
  fs::remove_all(dir);
}

TEST(NanPolicy, AbortNamesTheStepAndMicroStepSkipLeavesWeightsUnchanged) {
  const auto dir = make_temp_dir("nan-policy");
  // Plain SGD at an absurd rate diverges to inf/nan within a few steps.
  const auto run = kRun + " --set optim=sgd --set learning_rate=1e30 --set max_grad_norm=0 --set warmup_steps=0 " +
                   "--set lr_scheduler_type=constant --set max_steps=8";
  const auto aborted = run_cli("train " + run + " --set output_dir=" + dir + "/abort");
  EXPECT_EQ(aborted.exit_code, 1);
  EXPECT_NE(aborted.err.find("non-finite loss at optimizer step"), std::string::npos) << aborted.err;
  EXPECT_NE(aborted.err.find("(micro-step "), std::string::npos) << aborted.err;

  const auto skipped = run_cli("train " + run + " --set nan_policy=skip --set output_dir=" + dir + "/skip");
  EXPECT_EQ(skipped.exit_code, 0) << skipped.err;
  int skipped_steps = 0;
  double weight_norm_after_first_skip = -1;
  for (const auto& line : read_jsonl(dir + "/skip/metrics.jsonl")) {
    if (!line.contains("skipped") || !line["skipped"].get<bool>()) continue;
    ++skipped_steps;
    // A skipped step leaves the weights as they were.
    if (weight_norm_after_first_skip < 0) {
      weight_norm_after_first_skip = line["weight_norm"].get<double>();
    } else {
      EXPECT_EQ(line["weight_norm"].get<double>(), weight_norm_after_first_skip);
    }
  }
  EXPECT_GT(skipped_steps, 0);
  fs::remove_all(dir);
}

// In-process: a stop request raised from inside a window (by the dataset, at a
// known micro-step) hands over the partial window; a fresh trainer restored
// from it ends with exactly the weights of an uninterrupted run.
using gradaccum::testing::MemoryHook;
using gradaccum::testing::StopAfterFetches;

TEST(CheckpointPreemption, StopInsideAWindowThenRestoreGivesIdenticalWeights) {
  torch::manual_seed(3);
  gradaccum::testing::TensorDataset data(torch::randn({100, 6}), torch::randint(0, 3, {100}));
  core::TrainerOptions options;
  options.per_device_train_batch_size = 3;
  options.gradient_accumulation_steps = 5;  // 15 per step: 6 full windows and a partial one of 10
  options.num_train_epochs = 2;
  options.optimizer.learning_rate = 0.05;
  core::ObserverList quiet;

  auto make_model = [] {
    torch::manual_seed(11);
    return std::make_unique<gradaccum::models::Classifier>(
        torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3)));
  };
  auto straight_model = make_model();
  core::Trainer straight(options, *straight_model, data, nullptr, quiet);
  straight.run();

  // Stop during the 4th micro-step of step 9's window: epoch 1 takes 6 x 5 + 4
  // fetches (its last window holds 10 samples), step 8 five more, then 4.
  std::atomic<bool> stop{false};
  StopAfterFetches stopping(data, stop, 43);
  auto first_model = make_model();
  core::Trainer first(options, *first_model, stopping, nullptr, quiet);
  MemoryHook hook;
  hook.optimizer_ = &first.optimizer();
  hook.names_ = first.named_parameters();
  hook.module_ = &first_model->module();
  first.set_checkpointing(&hook, &stop);
  const auto partial_summary = first.run();
  EXPECT_TRUE(partial_summary.preempted);
  EXPECT_EQ(hook.saved.position.step, 8);
  EXPECT_EQ(hook.saved.position.micro_step, 4);
  EXPECT_EQ(core::Preemption::partial_window(hook.saved).grads.size(), 4u);

  auto second_model = make_model();
  core::Trainer second(options, *second_model, data, nullptr, quiet);
  gradaccum::models::load_module_tensors(second_model->module(), hook.weights, "memory");
  gradaccum::optim::load_optimizer_state(second.optimizer(), second.named_parameters(),
                                         gradaccum::formats::parse_safetensors(hook.optimizer, "memory"), "memory");
  second.restore(hook.saved);
  const auto summary = second.run();
  EXPECT_FALSE(summary.preempted);
  EXPECT_EQ(summary.steps, straight.total_steps());
  EXPECT_TRUE(torch::equal(gradaccum::testing::flat_params(second_model->module()),
                           gradaccum::testing::flat_params(straight_model->module())));
}

}  // namespace checkpoint_test
