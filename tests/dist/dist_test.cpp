// Data parallel: launcher environments, equivalence of W × N with 1 × W·N and
// the full batch, communication counts, and failures (a dead rank, a wrong
// rendezvous, mismatched configurations).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "gradaccum/base/check.h"
#include "gradaccum/dist/environment.h"
#include "gradaccum/dist/store_stop_agreement.h"
#include "gradaccum/formats/safetensors.h"
#include "test_support.h"

namespace dist_test {

using gradaccum::testing::make_temp_dir;
using gradaccum::testing::read_text;
using gradaccum::testing::run_cli;
namespace fs = std::filesystem;

// The per-step records of a run (evaluation records left out).
std::vector<nlohmann::json> step_lines(const std::string& dir) {
  std::vector<nlohmann::json> lines;
  for (auto& j : gradaccum::testing::read_jsonl(dir + "/metrics.jsonl")) {
    if (j.contains("loss")) lines.push_back(std::move(j));
  }
  return lines;
}

gradaccum::dist::DistEnvironment env_of(const std::map<std::string, std::string>& vars) {
  return gradaccum::dist::read_environment([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(DistEnvironment, TorchrunMpirunAndNone) {
  auto none = env_of({});
  EXPECT_EQ(none.world_size, 1);
  EXPECT_FALSE(none.distributed());
  auto torchrun = env_of({{"RANK", "3"},
                          {"WORLD_SIZE", "4"},
                          {"LOCAL_RANK", "1"},
                          {"LOCAL_WORLD_SIZE", "2"},
                          {"MASTER_ADDR", "10.1.2.3"},
                          {"MASTER_PORT", "29400"}});
  EXPECT_EQ(torchrun.rank, 3);
  EXPECT_EQ(torchrun.world_size, 4);
  EXPECT_EQ(torchrun.local_rank, 1);
  EXPECT_EQ(torchrun.local_world_size, 2);
  EXPECT_EQ(torchrun.master_addr, "10.1.2.3");
  EXPECT_EQ(torchrun.master_port, 29400);
  EXPECT_FALSE(torchrun.agent_store);
  EXPECT_TRUE(
      env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29400"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}})
          .agent_store);
  auto mpi = env_of({{"OMPI_COMM_WORLD_RANK", "1"},
                     {"OMPI_COMM_WORLD_SIZE", "2"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                     {"MASTER_PORT", "29500"}});
  EXPECT_EQ(mpi.rank, 1);
  EXPECT_EQ(mpi.world_size, 2);
  EXPECT_EQ(mpi.master_addr, "127.0.0.1");
  try {
    env_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}});
    FAIL();
  } catch (const gradaccum::Error& e) {
    EXPECT_STREQ(e.what(), "environment variable RANK='2': expected an integer in [0, 1]");
  }
  EXPECT_THROW(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}}), gradaccum::Error);  // no MASTER_PORT
  EXPECT_THROW(env_of({{"RANK", "0"}}), gradaccum::Error);                       // no WORLD_SIZE
  EXPECT_THROW(env_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}), gradaccum::Error);
}

// Float64 CNN with 3 gradient buckets (1 MB cap), 584 samples: 9 windows of 64
// and a partial one of 8, which rank 1 sits out at W = 2.
const std::string kRun =
    "train --set dtype=float64 --set model.channels=[8,16] --set model.hidden=[32] --set data.train_limit=584 "
    "--set data.eval_limit=100 --set max_steps=11 --set ddp_bucket_cap_mb=1 --set learning_rate=3e-3 "
    "--set warmup_steps=2 --set threads=1";

TEST(DataParallel, TwoRanksTimesTwoStepsEqualsOneRankAndTheFullBatch) {
  const auto root = make_temp_dir("dp-equivalence");
  struct Case {
    std::string args;
    int64_t world, micro_steps;
  };
  const std::vector<Case> cases = {
      {" --set per_device_train_batch_size=64 --set gradient_accumulation_steps=1", 1, 1},
      {" --set per_device_train_batch_size=16 --set gradient_accumulation_steps=4", 1, 4},
      {" --set per_device_train_batch_size=16 --set gradient_accumulation_steps=2 --nproc 2", 2, 2},
      {" --set per_device_train_batch_size=8 --set gradient_accumulation_steps=2 --set global_batch_size=64 --nproc 2",
       2, 4},
  };
  std::vector<std::vector<nlohmann::json>> runs;
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto out = root + "/run" + std::to_string(k);
    const auto r = run_cli(kRun + cases[k].args + " --set output_dir=" + out);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    runs.push_back(step_lines(out));
    ASSERT_EQ(runs.back().size(), 11u);
  }
  for (size_t k = 1; k < runs.size(); ++k) {
    for (size_t i = 0; i < 11; ++i) {
      const auto& a = runs[0][i];
      const auto& b = runs[k][i];
      const bool partial = i == 9;
      EXPECT_EQ(b["items"].get<int64_t>(), partial ? 8 : 64) << "case " << k << " step " << i;
      EXPECT_EQ(b["micro_steps"].get<int64_t>(), partial ? 1 : cases[k].micro_steps) << "case " << k;
      // The window's accounting: each micro-step's samples summed over ranks, each rank's.
      const auto per_micro_step = b["micro_step_items"].get<std::vector<int64_t>>();
      EXPECT_EQ(static_cast<int64_t>(per_micro_step.size()), b["micro_steps"].get<int64_t>()) << "case " << k;
      EXPECT_EQ(std::accumulate(per_micro_step.begin(), per_micro_step.end(), int64_t{0}), b["items"].get<int64_t>())
          << "case " << k << " step " << i;
      EXPECT_EQ(b["loss_normalization"], "window");
      if (cases[k].world > 1) {
        const auto per_rank = b["rank_items"].get<std::vector<int64_t>>();
        ASSERT_EQ(per_rank.size(), 2u) << "case " << k;
        EXPECT_EQ(per_rank[0] + per_rank[1], b["items"].get<int64_t>()) << "case " << k << " step " << i;
        if (!partial) EXPECT_EQ(per_rank[0], per_rank[1]) << "case " << k << " step " << i;
      } else {
        EXPECT_FALSE(b.contains("rank_items"));
      }
      for (const char* key : {"loss", "grad_norm", "weight_norm"}) {
        EXPECT_NEAR(b[key].get<double>(), a[key].get<double>(), 1e-10 * std::abs(a[key].get<double>()))
            << key << " case " << k << " step " << i;
      }
    }
  }
  fs::remove_all(root);
}

// The venv's torchrun (scripts/setup.sh) starting two ranks of the program gives, step by step,
// what --nproc 2 gives (float64). torchrun serves the store itself
// (TORCHELASTIC_USE_AGENT_STORE), so no rank may bind MASTER_PORT.
TEST(DataParallel, TorchrunTwoRanksEqualNproc2PerStep) {
  const std::string torchrun = gradaccum::testing::venv_program("torchrun");
  ASSERT_TRUE(fs::exists(torchrun)) << torchrun << " is missing: run scripts/setup.sh";
  const auto root = make_temp_dir("dp-torchrun");
  const std::string args = kRun + " --set per_device_train_batch_size=16 --set gradient_accumulation_steps=2";
  const auto r = run_cli(args + " --nproc 2 --set output_dir=" + root + "/nproc");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string port = std::to_string(20000 + (getpid() + 13) % 20000);
  const auto command = torchrun + " --nproc-per-node 2 --master-port " + port + " --no-python " + GRADACCUM_CLI + " " +
                       args + " --set output_dir=" + root + "/torchrun > " + root + "/torchrun.log 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << read_text(root + "/torchrun.log");
  const auto a = step_lines(root + "/nproc");
  const auto b = step_lines(root + "/torchrun");
  ASSERT_EQ(a.size(), 11u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i]["world_size"], 2) << "step " << i;
    EXPECT_EQ(b[i]["items"], a[i]["items"]) << "step " << i;
    for (const char* key : {"loss", "grad_norm", "weight_norm"}) {
      EXPECT_NEAR(b[i][key].get<double>(), a[i][key].get<double>(), 1e-10 * std::abs(a[i][key].get<double>()))
          << key << " step " << i;
    }
  }
  fs::remove_all(root);
}

TEST(DataParallel, OneAllReducePerBucketPerWindowUnlessSyncingEveryMicroStep) {
  const auto root = make_temp_dir("dp-calls");
  const std::string args =
      kRun + " --set max_steps=3 --set per_device_train_batch_size=8 --set gradient_accumulation_steps=4 --nproc 2";
  const auto deferred = run_cli(args + " --set output_dir=" + root + "/deferred");
  ASSERT_EQ(deferred.exit_code, 0) << deferred.err;
  const auto eager = run_cli(args + " --set sync_each_micro_step=true --set output_dir=" + root + "/eager");
  ASSERT_EQ(eager.exit_code, 0) << eager.err;
  const auto d = step_lines(root + "/deferred");
  const auto e = step_lines(root + "/eager");
  ASSERT_EQ(d.size(), 3u);
  ASSERT_EQ(e.size(), 3u);
  // Parameters of the [8,16]/32 CNN in float64: 8·9 + 16·8·9 + 784·32 + 32·10 + norms and biases.
  const int64_t bytes = d[0]["allreduce_bytes"].get<int64_t>();
  const int64_t buckets = d[0]["allreduce_calls"].get<int64_t>();
  EXPECT_EQ(buckets, 1);  // 26 k parameters × 8 bytes fit one 1 MB bucket
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(d[i]["world_size"].get<int64_t>(), 2);
    EXPECT_EQ(d[i]["allreduce_calls"].get<int64_t>(), buckets);
    EXPECT_EQ(e[i]["allreduce_calls"].get<int64_t>(), 4 * buckets);
    EXPECT_EQ(e[i]["allreduce_bytes"].get<int64_t>(), 4 * bytes);
    // Syncing every micro-step changes the cost, not the result.
    EXPECT_NEAR(e[i]["loss"].get<double>(), d[i]["loss"].get<double>(), 1e-10 * d[i]["loss"].get<double>());
    EXPECT_NEAR(e[i]["grad_norm"].get<double>(), d[i]["grad_norm"].get<double>(),
                1e-10 * d[i]["grad_norm"].get<double>());
  }
  // The default CNN in float64 (3.4 MB): walking backward from the head, the
  // head and fc bias share a bucket, the 3.2 MB fc weight exceeds the 1 MB cap
  // and gets its own, and the conv and norm layers share a third.
  const auto big = run_cli(
      "train --set dtype=float64 --set data.train_limit=128 --set data.eval_limit=-1 "
      "--set max_steps=1 --set ddp_bucket_cap_mb=1 --set threads=1 --nproc 2 "
      "--set per_device_train_batch_size=8 --set gradient_accumulation_steps=4 --set output_dir=" +
      root + "/big");
  ASSERT_EQ(big.exit_code, 0) << big.err;
  const auto b = step_lines(root + "/big");
  EXPECT_EQ(b[0]["allreduce_calls"].get<int64_t>(), 3);
  EXPECT_EQ(b[0]["allreduce_bytes"].get<int64_t>(), 421738 * 8);
  fs::remove_all(root);
}

TEST(DataParallel, ZeroStage1GivesTheSameWeightsAsPlainDataParallel) {
  const auto root = make_temp_dir("dp-zero");
  std::vector<std::vector<nlohmann::json>> runs;
  for (const char* stage : {"0", "1"}) {
    for (const char* optimizer : {"adamw", "sgd --set momentum=0.9"}) {
      const auto out = root + "/zero" + stage + optimizer[0];
      const auto r = run_cli(kRun +
                             " --set per_device_train_batch_size=16 --set gradient_accumulation_steps=2 --nproc 2"
                             " --set zero_stage=" +
                             stage + " --set optim=" + optimizer + " --set output_dir=" + out);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      runs.push_back(step_lines(out));
      ASSERT_EQ(runs.back().size(), 11u);
      // Every rank reports its own peak memory: the whole run's, and the
      // training loop's (as of the last step, before the end-of-run saves).
      const auto rank1 = nlohmann::json::parse(read_text(out + "/rank1.json"));
      EXPECT_GT(rank1["train_peak_rss_mb"].get<double>(), 10.0);
      EXPECT_LE(rank1["train_peak_rss_mb"].get<double>(), rank1["peak_rss_mb"].get<double>());
    }
  }
  for (size_t opt = 0; opt < 2; ++opt) {
    for (size_t i = 0; i < 11; ++i) {
      const auto& plain = runs[opt][i];
      const auto& zero = runs[2 + opt][i];
      for (const char* key : {"loss", "grad_norm", "weight_norm"}) {
        EXPECT_NEAR(zero[key].get<double>(), plain[key].get<double>(), 1e-12 * std::abs(plain[key].get<double>()))
            << key << " optimizer " << opt << " step " << i;
      }
    }
  }
  fs::remove_all(root);
}

// A run of kRun with `args`: what its records' `sharded_grad_sync` says ("" for one process), its
// micro-steps per window, and a line its stderr holds ("" for none).
struct ShardedCase {
  std::string args;
  std::string policy;
  int64_t micro_steps;
  std::string says;
};

// Each case after the first (one process) against the first, in float64: per step the loss, grad
// norm and weight norm within 1e-10, the policy, and `reductions_per_window` reduce-scatters per
// reduction (one per micro-step for each_micro_step, one for the partial window's single
// micro-step, one per window for defer); the final weights within 1e-10.
void expect_sharded_cases_equal_one_process(const std::string& root, const std::vector<ShardedCase>& cases,
                                            const std::function<int64_t(const nlohmann::json&)>& reductions) {
  std::vector<std::vector<nlohmann::json>> runs;
  std::vector<gradaccum::formats::NamedTensors> finals;
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto out = root + "/run" + std::to_string(k);
    const auto r = run_cli(kRun + cases[k].args + " --set output_dir=" + out);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    if (!cases[k].says.empty()) EXPECT_NE(r.err.find(cases[k].says), std::string::npos) << r.err;
    runs.push_back(step_lines(out));
    ASSERT_EQ(runs.back().size(), 11u);
    finals.push_back(gradaccum::formats::load_safetensors(out + "/final/model.safetensors"));
  }
  const int64_t per_reduction = reductions(runs[1][0]);
  for (size_t k = 1; k < runs.size(); ++k) {
    for (size_t i = 0; i < 11; ++i) {
      const auto& a = runs[0][i];
      const auto& b = runs[k][i];
      const bool partial = i == 9;  // 8 samples: one micro-step
      EXPECT_EQ(b["sharded_grad_sync"], cases[k].policy) << "case " << k;
      const int64_t windows = cases[k].policy == "defer" ? 1 : (partial ? 1 : cases[k].micro_steps);
      EXPECT_EQ(b["reduce_scatter_calls"].get<int64_t>(), per_reduction * windows) << "case " << k << " step " << i;
      EXPECT_FALSE(b.contains("allreduce_calls"));
      for (const char* key : {"loss", "grad_norm", "weight_norm"}) {
        EXPECT_NEAR(b[key].get<double>(), a[key].get<double>(), 1e-10 * std::abs(a[key].get<double>()))
            << key << " case " << k << " step " << i;
      }
    }
    ASSERT_EQ(finals[k].size(), finals[0].size());
    for (size_t t = 0; t < finals[0].size(); ++t) {
      const auto& [name, reference] = finals[0][t];
      EXPECT_EQ(finals[k][t].first, name);
      const double scale = std::max(1.0, reference.abs().max().item<double>());
      EXPECT_LE((finals[k][t].second - reference).abs().max().item<double>(), 1e-10 * scale) << name << " case " << k;
    }
  }
}

// ZeRO-2 against one process in float64: b·N·W = 64 samples in every case, for both policies (and
// auto) at W = 2 and each_micro_step at W = 4; its reduce-scatters: one per chunk per reduction
// (the [8,16]/32 CNN's 26 k float64 parameters make one chunk of the 1 MB cap).
TEST(DataParallel, ZeroStage2EqualsOneProcessForBothPoliciesFloat64) {
  const auto root = make_temp_dir("dp-zero2");
  const std::string zero2 = " --set zero_stage=2 --set sharded_grad_sync=";
  expect_sharded_cases_equal_one_process(
      root,
      {{" --set per_device_train_batch_size=64 --set gradient_accumulation_steps=1", "", 1, ""},
       {" --set per_device_train_batch_size=16 --set gradient_accumulation_steps=2 --nproc 2" + zero2 + "defer",
        "defer", 2, ""},
       {" --set per_device_train_batch_size=16 --set gradient_accumulation_steps=2 --nproc 2" + zero2 +
            "each_micro_step",
        "each_micro_step", 2, ""},
       {" --set per_device_train_batch_size=8 --set gradient_accumulation_steps=4 --nproc 2" + zero2 + "auto", "defer",
        4, "sharded_grad_sync auto: defer: deferring holds the whole gradient"},
       {" --set per_device_train_batch_size=8 --set gradient_accumulation_steps=2 --nproc 4" + zero2 +
            "each_micro_step",
        "each_micro_step", 2, ""}},
      [](const nlohmann::json&) { return int64_t{1}; });
  fs::remove_all(root);
}

// ZeRO-3 against one process in float64, the same way: the CNN's layers are its units
// (sharded_parameters.h), gathered for their forward and backward, and the final weights gathered
// whole for final/; one reduce-scatter per unit per reduction, at W = 2 and 4.
TEST(DataParallel, ZeroStage3EqualsOneProcessForBothPoliciesFloat64) {
  const auto root = make_temp_dir("dp-zero3");
  const std::string zero3 = " --set zero_stage=3 --set sharded_grad_sync=";
  int64_t units = 0;
  expect_sharded_cases_equal_one_process(
      root,
      {{" --set per_device_train_batch_size=64 --set gradient_accumulation_steps=1", "", 1, ""},
       {" --set per_device_train_batch_size=16 --set gradient_accumulation_steps=2 --nproc 2" + zero3 + "defer",
        "defer", 2, ""},
       {" --set per_device_train_batch_size=8 --set gradient_accumulation_steps=4 --nproc 2" + zero3 +
            "each_micro_step",
        "each_micro_step", 4, ""},
       {" --set per_device_train_batch_size=8 --set gradient_accumulation_steps=2 --nproc 4" + zero3 + "defer", "defer",
        2, ""},
       {" --set per_device_train_batch_size=8 --set gradient_accumulation_steps=2 --nproc 4" + zero3 + "auto", "defer",
        2, "each_micro_step for none"}},
      [&](const nlohmann::json& defer_step) {
        // The units that hold parameters: defer's reduce-scatters in a window.
        units = defer_step["reduce_scatter_calls"].get<int64_t>();
        return units;
      });
  EXPECT_GE(units, 4);
  fs::remove_all(root);
}

// One process has nothing to shard: a note, and the run is zero_stage 0's.
TEST(DataParallel, ZeroStage2WithOneProcessIsANoteAndRunsAsStage0) {
  const auto root = make_temp_dir("dp-zero2-one");
  const std::string args = kRun + " --set max_steps=2 --set per_device_train_batch_size=16";
  const auto plain = run_cli(args + " --set output_dir=" + root + "/plain");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const auto zero =
      run_cli(args + " --set zero_stage=2 --set sharded_grad_sync=defer --set output_dir=" + root + "/zero");
  ASSERT_EQ(zero.exit_code, 0) << zero.err;
  EXPECT_NE(zero.err.find("zero_stage 2 with one process: nothing to shard across ranks; it runs as zero_stage 0\n"),
            std::string::npos)
      << zero.err;
  const auto a = step_lines(root + "/plain");
  const auto b = step_lines(root + "/zero");
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(b[i]["loss"], a[i]["loss"]);
    EXPECT_FALSE(b[i].contains("sharded_grad_sync"));
  }
  fs::remove_all(root);
}

// Starts `args` with extra environment variables; returns the pid.
pid_t spawn(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
            const std::string& err_path) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // its own process group, so a failed test can kill all its ranks
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    freopen("/dev/null", "w", stdout);
    freopen(err_path.c_str(), "w", stderr);
    std::vector<char*> argv{const_cast<char*>(GRADACCUM_CLI)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(GRADACCUM_CLI, argv.data());
    _exit(127);
  }
  return pid;
}

// Kills the process groups of the spawned jobs when a test ends, even by a
// failed assertion, so no rank outlives its test.
struct KillOnExit {
  std::vector<pid_t> pids;
  ~KillOnExit() {
    for (auto pid : pids) kill(-pid, SIGKILL);
    for (auto pid : pids) waitpid(pid, nullptr, WNOHANG);
  }
};

// Waits up to `limit` for `pid`; returns its status, or -1 (and kills it) on time-out.
int wait_within(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

std::vector<std::string> split_args(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// Preemption with several ranks: the first decision of a window (a rank asked
// to stop, or a rank entering the last micro-step) is every rank's answer.
TEST(StopAgreement, FirstDecisionOfAWindowBindsEveryRank) {
  using gradaccum::dist::StoreStopAgreement;
  auto store = c10::make_intrusive<c10d::HashStore>();
  const auto every_time = std::chrono::milliseconds(0);
  StoreStopAgreement rank0(store, 0, every_time);
  StoreStopAgreement rank1(store, 1, every_time);
  // Window 1: rank 1 is asked to stop before any rank entered the last micro-step.
  EXPECT_FALSE(rank0.stop_here(1, false, false));  // nothing decided yet
  EXPECT_TRUE(rank1.stop_here(1, true, false));
  EXPECT_TRUE(rank0.stop_here(1, false, false));  // its poll finds the stop
  // Window 2: rank 0 entered the last micro-step first; rank 1's later request
  // must wait for the window's end (rank 0 is in the all-reduce).
  EXPECT_FALSE(rank0.stop_here(2, false, true));
  EXPECT_FALSE(rank1.stop_here(2, true, false));
  EXPECT_FALSE(rank1.stop_here(2, true, true));
  // Rank 0 forgets window 2 once it ended: a new decision can be taken.
  rank0.window_finished(2);
  StoreStopAgreement rank1_again(store, 1, every_time);
  EXPECT_TRUE(rank1_again.stop_here(2, true, false));
  // Polls are rate-limited: a rank that was not asked finds a stop at its next
  // poll, or at the latest before its last micro-step.
  StoreStopAgreement slow(store, 1, std::chrono::hours(1));
  EXPECT_TRUE(rank0.stop_here(3, true, false));
  EXPECT_FALSE(slow.stop_here(3, false, false));
  EXPECT_TRUE(slow.stop_here(3, false, true));
}

TEST(DataParallelFailures, KilledRankStopsTheJobAndIsNamed) {
  const auto dir = make_temp_dir("dp-kill");
  auto args = split_args(
      "train --set data.train_limit=60000 --set data.eval_limit=-1 --set max_steps=100000 "
      "--set threads=1 --set dist_timeout=10 --nproc 2 --set output_dir=" +
      dir + "/out");
  const pid_t launcher = spawn(args, {}, dir + "/stderr");
  KillOnExit guard{{launcher}};
  // Wait until training runs, then kill rank 1 in the middle of a window.
  const auto metrics = dir + "/out/metrics.jsonl";
  for (int i = 0; i < 600 && (!fs::exists(metrics) || fs::file_size(metrics) < 400); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(fs::exists(metrics)) << read_text(dir + "/stderr");
  const pid_t rank1 = gradaccum::testing::rank_pid(launcher, 1);
  ASSERT_GT(rank1, 0);
  ASSERT_EQ(kill(rank1, SIGKILL), 0);
  const auto start = std::chrono::steady_clock::now();
  const int status = wait_within(launcher, std::chrono::seconds(30));
  ASSERT_NE(status, -1) << "the job did not stop within 30 s";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const auto err = read_text(dir + "/stderr");
  EXPECT_NE(err.find("gradaccum: error: rank 1 was killed by signal 9"), std::string::npos) << err;
  // The surviving rank's line carries Gloo's cause, not its source location and advice.
  EXPECT_EQ(err.find(".cc:"), std::string::npos) << err;
  EXPECT_EQ(err.find("GLHF"), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(DataParallelFailures, SurvivingRankOfATorchrunStyleJobFailsWithinTheTimeout) {
  const auto dir = make_temp_dir("dp-torchrun");
  const std::string port = std::to_string(20000 + getpid() % 20000);
  const auto args = split_args(
      "train --set data.train_limit=60000 --set data.eval_limit=-1 --set max_steps=100000 "
      "--set threads=1 --set dist_timeout=5 --set output_dir=" +
      dir + "/out");
  std::map<std::string, std::string> env{{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}};
  env["RANK"] = "0";
  const pid_t rank0 = spawn(args, env, dir + "/stderr0");
  env["RANK"] = "1";
  const pid_t rank1 = spawn(args, env, dir + "/stderr1");
  KillOnExit guard{{rank0, rank1}};
  const auto metrics = dir + "/out/metrics.jsonl";
  for (int i = 0; i < 600 && (!fs::exists(metrics) || fs::file_size(metrics) < 400); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(fs::exists(metrics)) << read_text(dir + "/stderr0");
  kill(rank1, SIGKILL);
  waitpid(rank1, nullptr, 0);
  const int status = wait_within(rank0, std::chrono::seconds(30));
  ASSERT_NE(status, -1) << "rank 0 hung after its peer died";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1);
  const auto err = read_text(dir + "/stderr0");
  EXPECT_NE(err.find("gradaccum: error: rank 0: "), std::string::npos) << err;
  EXPECT_NE(err.find("a peer rank died or stalled past dist_timeout"), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(DataParallelFailures, NoRendezvousIsAClearErrorWithinTheTimeout) {
  const auto dir = make_temp_dir("dp-rendezvous");
  // Rank 1 of 2 with nobody serving the port.
  const pid_t pid =
      spawn(split_args("train --set dist_timeout=3 --set output_dir=" + dir + "/out"),
            {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "9"}}, dir + "/stderr");
  KillOnExit guard{{pid}};
  const int status = wait_within(pid, std::chrono::seconds(30));
  ASSERT_NE(status, -1);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1);
  const auto err = read_text(dir + "/stderr");
  EXPECT_NE(err.find("gradaccum: error: rank 1: cannot rendezvous at MASTER_ADDR=127.0.0.1 MASTER_PORT=9 within 3 s"),
            std::string::npos)
      << err;
  fs::remove_all(dir);
}

// A TCP listener on a loopback port of its own that accepts connections and never answers (the
// port held by some other program); the connections stay open until it is destroyed.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length), 0);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        const int connection = accept(fd_, nullptr, nullptr);
        if (connection < 0) return;  // shut down
        connections_.push_back(connection);
      }
    });
  }
  ~SilentListener() {
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    for (int c : connections_) close(c);
    close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::vector<int> connections_;
  std::thread thread_;
};

// Every rendezvous wait of a non-zero rank ends within dist_timeout, with one line: whether
// nothing listens at MASTER_PORT or a program there accepts and never answers (c10d's client
// waits for that answer without a timeout of its own, and logs C++ stack traces as it retries).
TEST(DataParallelFailures, RendezvousWaitsEndWithinTheTimeoutInOneLine) {
  const auto dir = make_temp_dir("dp-silent");
  SilentListener silent;
  for (const int port : {silent.port(), 9}) {
    const auto err_path = dir + "/stderr" + std::to_string(port);
    const auto start = std::chrono::steady_clock::now();
    const pid_t pid =
        spawn(split_args("train --set dist_timeout=3 --set data.train_limit=64 --set output_dir=" + dir + "/out"),
              {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}},
              err_path);
    KillOnExit guard{{pid}};
    const int status = wait_within(pid, std::chrono::seconds(20));
    const auto elapsed = std::chrono::steady_clock::now() - start;
    const auto err = read_text(err_path);
    ASSERT_NE(status, -1) << "rank 1 still waited after 20 s with dist_timeout=3 (port " << port << ")";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << err;
    // Start-up (libtorch, the data) takes a second or two before the rendezvous begins.
    EXPECT_LT(elapsed, std::chrono::seconds(3 + 4)) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_NE(err.find(fmt::format("gradaccum: error: rank 1: cannot rendezvous at MASTER_ADDR=127.0.0.1 "
                                   "MASTER_PORT={} within 3 s: ",
                                   port)),
              std::string::npos)
        << err;
    if (port == silent.port()) {
      EXPECT_NE(err.find("accepted the connection but never answered"), std::string::npos) << err;
    }
  }
  EXPECT_FALSE(fs::exists(dir + "/out"));
  fs::remove_all(dir);
}

// The ranks of a SIGKILLed `--nproc` launcher die with it (PR_SET_PDEATHSIG) instead of training on
// into output_dir.
TEST(DataParallelFailures, RanksDieWithTheirKilledLauncher) {
  const auto dir = make_temp_dir("dp-orphans");
  const pid_t launcher = spawn(split_args("train --set data.train_limit=60000 --set data.eval_limit=-1 "
                                          "--set max_steps=100000 --set threads=1 --nproc 2 --set output_dir=" +
                                          dir + "/out"),
                               {}, dir + "/stderr");
  KillOnExit guard{{launcher}};
  const auto metrics = dir + "/out/metrics.jsonl";
  for (int i = 0; i < 600 && (!fs::exists(metrics) || fs::file_size(metrics) < 400); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(fs::exists(metrics)) << read_text(dir + "/stderr");
  const pid_t rank0 = gradaccum::testing::rank_pid(launcher, 0);
  const pid_t rank1 = gradaccum::testing::rank_pid(launcher, 1);
  ASSERT_GT(rank0, 0);
  ASSERT_GT(rank1, 0);
  ASSERT_EQ(kill(launcher, SIGKILL), 0);
  waitpid(launcher, nullptr, 0);
  // Gone, or a zombie waiting for whoever adopted it.
  const auto running = [](pid_t pid) {
    const auto stat = read_text("/proc/" + std::to_string(pid) + "/stat");
    const auto close_paren = stat.rfind(')');
    return close_paren != std::string::npos && close_paren + 2 < stat.size() && stat[close_paren + 2] != 'Z';
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while ((running(rank0) || running(rank1)) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const bool orphans = running(rank0) || running(rank1);
  if (orphans) {
    kill(rank0, SIGKILL);
    kill(rank1, SIGKILL);
  }
  EXPECT_FALSE(orphans) << "a rank still ran 1 s after its launcher's SIGKILL";
  fs::remove_all(dir);
}

TEST(DataParallelFailures, MismatchedConfigurationsAreRefused) {
  const auto dir = make_temp_dir("dp-mismatch");
  const std::string port = std::to_string(20000 + (getpid() + 7) % 20000);
  std::map<std::string, std::string> env{{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}};
  const std::string common =
      "train --set dist_timeout=20 --set data.train_limit=256 --set max_steps=2 --set output_dir=" + dir + "/out";
  env["RANK"] = "0";
  const pid_t rank0 = spawn(split_args(common + " --set learning_rate=0.001"), env, dir + "/stderr0");
  env["RANK"] = "1";
  const pid_t rank1 = spawn(split_args(common + " --set learning_rate=0.002"), env, dir + "/stderr1");
  KillOnExit guard{{rank0, rank1}};
  const int s0 = wait_within(rank0, std::chrono::seconds(60));
  const int s1 = wait_within(rank1, std::chrono::seconds(60));
  ASSERT_NE(s0, -1);
  ASSERT_NE(s1, -1);
  EXPECT_TRUE(WIFEXITED(s0) && WEXITSTATUS(s0) == 1);
  EXPECT_TRUE(WIFEXITED(s1) && WEXITSTATUS(s1) == 1);
  EXPECT_NE(read_text(dir + "/stderr0").find("gradaccum: error: rank 1's configuration differs from rank 0's"),
            std::string::npos)
      << read_text(dir + "/stderr0");
  EXPECT_FALSE(fs::exists(dir + "/out/metrics.jsonl"));
  fs::remove_all(dir);
}

}  // namespace dist_test
