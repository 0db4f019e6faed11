// Several hosts for real: network namespaces on a bridge (namespace_hosts.h), one torchrun agent
// per host. With torchrun's static rendezvous and with its c10d rendezvous the hosts train exactly
// as `--nproc K` does; under an elastic torchrun a host killed with its agent and workers mid-run
// leaves the survivors to fail within dist_timeout naming it, restart at the smaller W, resume
// from the latest checkpoint with the same global batch, and take the host back when it returns:
// the run's records equal an uninterrupted run's step for step (float64).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "namespace_hosts.h"
#include "test_support.h"

namespace multi_host_test {

using gradaccum::testing::make_temp_dir;
using gradaccum::testing::NamespaceHosts;
using gradaccum::testing::read_text;
using gradaccum::testing::run_cli;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The CNN in float64 with windows of 256 samples in micro-batches of 8: N = 16 on two ranks and
// 32 on one, so a step takes long enough (~0.2 s on one rank) for a host to be lost and to come
// back while the run goes on.
const std::string kRun =
    "train --set dtype=float64 --set model.channels=[8,16] --set model.hidden=[32] --set data.train_limit=2048 "
    "--set data.eval_limit=-1 --set learning_rate=3e-3 --set warmup_steps=2 --set threads=1 "
    "--set per_device_train_batch_size=8 --set global_batch_size=256";

// The step records of a metrics.jsonl that another process may be writing: complete lines only.
std::vector<nlohmann::json> steps_so_far(const std::string& dir) {
  std::vector<nlohmann::json> steps;
  std::ifstream in(dir + "/metrics.jsonl");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  size_t begin = 0;
  for (size_t end = text.find('\n'); end != std::string::npos; begin = end + 1, end = text.find('\n', begin)) {
    auto line = nlohmann::json::parse(text.substr(begin, end - begin), nullptr, /*allow_exceptions=*/false);
    if (line.is_object() && line.contains("loss")) steps.push_back(std::move(line));
  }
  return steps;
}

void expect_same_steps(const std::vector<nlohmann::json>& reference, const std::vector<nlohmann::json>& run,
                       const std::string& what) {
  ASSERT_EQ(run.size(), reference.size()) << what;
  for (size_t i = 0; i < run.size(); ++i) {
    EXPECT_EQ(run[i]["step"], reference[i]["step"]) << what;
    EXPECT_EQ(run[i]["samples"], reference[i]["samples"]) << what << " step " << i + 1;
    for (const char* key : {"loss", "grad_norm", "weight_norm"}) {
      EXPECT_NEAR(run[i][key].get<double>(), reference[i][key].get<double>(),
                  1e-10 * std::abs(reference[i][key].get<double>()))
          << what << " " << key << " step " << i + 1;
    }
  }
}

// Starts `command` on `host` in the background; its exit status goes to `rc_file`, its output
// to `log`. Bounded: killed after `limit_s`.
void start_on(const NamespaceHosts& hosts, int host, const std::string& command, const std::string& log,
              const std::string& rc_file, int limit_s = 300) {
  const auto line =
      hosts.on(host, fmt::format("timeout -s KILL {} {} > {} 2>&1; echo $? > {}", limit_s, command, log, rc_file));
  ASSERT_EQ(std::system((line + " &").c_str()), 0);
}

// The exit status a start_on() command wrote, waiting up to `limit`; -1 if none came.
int wait_rc(const std::string& rc_file, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (fs::exists(rc_file)) {
      const auto text = read_text(rc_file);
      if (!text.empty() && text.back() == '\n') return std::stoi(text);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return -1;
}

std::string torchrun() {
  const auto path = gradaccum::testing::venv_program("torchrun");
  EXPECT_TRUE(fs::exists(path)) << path << " is missing: run scripts/setup.sh";
  return path;
}

// The c10d rendezvous inside a namespace needs two things that a real host has by itself: host
// 0's agent must be told that it hosts the store (is_host=1: it would compare the endpoint with
// the machine's hostname, whose address is not the namespace's, and wait as a client of a store
// nobody serves), and every agent must give its own address (--local-addr: it would advertise
// the machine's hostname, unreachable from the other namespaces, as MASTER_ADDR). And for a host
// that joins a later round, torchrun 2.15's sharing of one TCPStore across rounds must be off
// (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): an agent that was rank 0 before keeps its store and
// never publishes MASTER_ADDR for the new round, which the newcomer waits for until it times out.
std::string c10d_agent(const NamespaceHosts& hosts, int host, const std::string& nnodes, int port,
                       const std::string& id, const std::string& extra_conf = "") {
  return fmt::format(
      "env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 {} --nnodes {} --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint "
      "{}:{} --rdzv-id {} --local-addr {} --rdzv-conf is_host={}{}",
      torchrun(), nnodes, hosts.address(0), port, id, hosts.address(host), host == 0 ? 1 : 0, extra_conf);
}

int test_port() { return 21000 + static_cast<int>(::getpid() % 20000); }

// torchrun's static rendezvous: host 0's agent serves the store at its own address.
std::string static_agent(const NamespaceHosts& hosts, int host, int port) {
  return fmt::format("{} --nnodes {} --node-rank {} --nproc-per-node 1 --master-addr {} --master-port {}", torchrun(),
                     hosts.size(), host, hosts.address(0), port);
}

// The steps of `run` on `k` local ranks (--nproc) in dir/nproc: the reference of a multi-host run.
std::vector<nlohmann::json> nproc_steps(const std::string& run, int k, const std::string& dir) {
  const auto local = run_cli(run + fmt::format(" --nproc {} --set output_dir={}/nproc", k, dir));
  EXPECT_EQ(local.exit_code, 0) << local.err;
  return steps_so_far(dir + "/nproc");
}

TEST(MultiHost, TorchrunOnTwoHostsWithTheStaticAndTheC10dRendezvousEqualsNproc2PerStep) {
  NamespaceHosts hosts(2);
  if (!hosts.why_not().empty()) GTEST_SKIP() << hosts.why_not();
  const auto root = make_temp_dir("multi-host");
  const std::string run = kRun + " --set max_steps=4 --set global_batch_size=64";
  const auto reference = nproc_steps(run, 2, root);
  ASSERT_EQ(reference.size(), 4u);

  for (const std::string rendezvous : {"static", "c10d"}) {
    SCOPED_TRACE(rendezvous);
    const auto out = root + "/" + rendezvous;
    for (int h = 0; h < 2; ++h) {
      const std::string agent = rendezvous == "static"
                                    ? static_agent(hosts, h, test_port())
                                    : c10d_agent(hosts, h, "2", test_port() + 1, fmt::format("ga{}", ::getpid()));
      start_on(hosts, h, agent + " --no-python " + GRADACCUM_CLI + " " + run + " --set output_dir=" + out,
               fmt::format("{}-host{}.log", out, h), fmt::format("{}-host{}.rc", out, h), 180);
    }
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(wait_rc(fmt::format("{}-host{}.rc", out, h), std::chrono::seconds(200)), 0)
          << read_text(fmt::format("{}-host{}.log", out, h));
    }
    const auto steps = steps_so_far(out);
    for (const auto& s : steps) EXPECT_EQ(s["world_size"], 2);
    expect_same_steps(reference, steps, rendezvous);
  }
  fs::remove_all(root);
}

// Waits until `ready` holds for the run's records, `limit` has passed, or the agent whose exit
// status goes to `rc_file` has ended; true if it held.
template <typename F>
bool wait_for_steps(const std::string& dir, F&& ready, std::chrono::seconds limit, const std::string& rc_file) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (ready(steps_so_far(dir))) return true;
    if (fs::exists(rc_file)) return ready(steps_so_far(dir));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// K hosts under torchrun --nnodes K-1:K with restarts; checkpoints every 2 steps,
// resume_from_checkpoint=auto, global_batch_size fixed. The last host is killed (agent and
// workers, SIGKILL) after `kill_after` steps: the survivors' workers fail at once naming the lost
// peer, their agents restart them at W = K - 1 (N scaled up), and they resume from the latest
// checkpoint. The host's agent started again raises W back to K at the next round (the
// survivors' workers, stopped by their agents with SIGTERM, save their window on the way out).
// The records equal `--nproc K`'s step for step and say W went K, K - 1, K.
void expect_elastic_run(int k, const std::string& run, size_t steps, size_t kill_after, const std::string& name) {
  NamespaceHosts hosts(k);
  if (!hosts.why_not().empty()) GTEST_SKIP() << hosts.why_not();
  const auto root = make_temp_dir(name);
  const auto reference = nproc_steps(run, k, root);
  ASSERT_EQ(reference.size(), steps);

  const auto out = root + "/elastic";
  const std::string id = fmt::format("{}{}", name, ::getpid());
  // last_call_timeout: how long a round waits for more hosts once it has enough (the first round
  // sees them all: the others are waiting when host 0's agent starts).
  const auto agent = [&](int h) {
    return c10d_agent(hosts, h, fmt::format("{}:{}", k - 1, k), test_port() + 2 + k, id, ",last_call_timeout=2") +
           " --max-restarts 4 --monitor-interval 0.2 --no-python " + GRADACCUM_CLI + " " + run +
           " --set save_steps=2 --set dist_timeout=20 --set resume_from_checkpoint=auto --set output_dir=" + out;
  };
  const auto log = [&](int h, const char* attempt = "") { return fmt::format("{}-host{}{}.log", out, h, attempt); };
  const auto rc = [&](int h, const char* attempt = "") { return fmt::format("{}-host{}{}.rc", out, h, attempt); };
  const auto logs = [&] {
    std::string all;
    for (int h = 0; h < k; ++h) all += read_text(log(h)) + read_text(log(h, "b"));
    return all;
  };
  const int lost = k - 1;
  // Host 0's agent serves the store the others wait for: it starts last, so that they are waiting.
  for (int h = k - 1; h >= 0; --h) start_on(hosts, h, agent(h), log(h), rc(h));
  ASSERT_TRUE(wait_for_steps(
      out, [&](const auto& s) { return s.size() >= kill_after; }, std::chrono::seconds(120), rc(0)))
      << logs();
  const auto lost_at = Clock::now();
  hosts.kill_host(lost);

  // The survivors go on without it: records at W = K - 1 after the resumed step.
  ASSERT_TRUE(wait_for_steps(
      out,
      [&](const auto& s) {
        return !s.empty() && s.back().value("world_size", 1) == k - 1 && s.size() >= kill_after + 2;
      },
      std::chrono::seconds(120), rc(0)))
      << logs();
  const double alone_after_s = std::chrono::duration<double>(Clock::now() - lost_at).count();
  ASSERT_LT(steps_so_far(out).size(), steps) << "the run ended before the host could come back";
  start_on(hosts, lost, agent(lost), log(lost, "b"), rc(lost, "b"));
  for (int h = 0; h < k; ++h) {
    EXPECT_EQ(wait_rc(h == lost ? rc(h, "b") : rc(h), std::chrono::seconds(240)), 0) << logs();
  }

  // The lost peer is named, in one line, well within dist_timeout.
  const auto log0 = read_text(log(0));
  EXPECT_NE(log0.find("failed, a peer rank died or stalled past dist_timeout"), std::string::npos) << log0;
  // By its address (Gloo's words) and by its rank (dist/peer_addresses.h).
  std::smatch named;
  ASSERT_TRUE(
      std::regex_search(log0, named, std::regex("\\[" + hosts.address(lost) + "\\]:[0-9]+ \\(rank ([0-9]+)\\)")))
      << log0;
  EXPECT_LT(std::stoi(named[1].str()), k) << named[0];
  EXPECT_LT(alone_after_s, 90.0);

  const auto records = steps_so_far(out);
  expect_same_steps(reference, records, name);
  std::vector<int64_t> worlds;
  for (const auto& r : records) {
    const int64_t w = r.value("world_size", int64_t{1});  // one process writes none
    if (worlds.empty() || worlds.back() != w) worlds.push_back(w);
  }
  EXPECT_EQ(worlds, (std::vector<int64_t>{k, k - 1, k})) << "{K, K - 1}: the host came back after the run's end";
  fs::remove_all(root);
}

// Windows of 512 samples: ~0.35 s a step on one rank, and 66 steps after the loss: the host is
// back well before the end, also on a loaded machine (its agent's start and a round take ~10 s).
// Under ZeRO-2 every restart reshards the gradients' and moments' ranges for the new W.
TEST(MultiHost, ElasticTorchrunGoesFromTwoHostsToOneAndBackKeepingTheCnnsGlobalBatchUnderZero2) {
  expect_elastic_run(2,
                     kRun +
                         " --set data.train_limit=4096 --set global_batch_size=512 --set max_steps=72 "
                         "--set zero_stage=2",
                     72, 6, "elastic-cnn");
}

// A decoder LM with padding on three hosts: W = 3 (N = 4), 2 (N = 6), 3.
TEST(MultiHost, ElasticTorchrunGoesFromThreeHostsToTwoAndBackKeepingAnLmsGlobalBatch) {
  const std::string lm =
      "train --set dtype=float64 --set model.type=gpt2 --set model.n_layer=2 --set model.n_embd=32 "
      "--set model.n_head=2 --set model.n_positions=64 --set data.type=kjv --set data.max_length=48 "
      "--set data.train_limit=4000 --set data.eval_limit=-1 --set learning_rate=1e-3 --set threads=1 "
      "--set per_device_train_batch_size=2 --set global_batch_size=24 --set max_steps=60";
  expect_elastic_run(3, lm, 60, 6, "elastic-lm");
}

// Faults on the link between two hosts (static rendezvous, checkpoints every 2 steps), each with
// its documented outcome. A slow and lossy link (netem delay 20 ms, loss 5 %) and a link taken
// down for 3 s (under dist_timeout): TCP rides them out and the run finishes with the
// uninterrupted run's steps. A link taken down for good: both hosts stop within dist_timeout,
// no checkpoint is left half-written, and the latest one resumes exactly.
TEST(MultiHost, LinkFaultsAreRiddenOutOrStopWithinDistTimeoutAndResumeExactly) {
  NamespaceHosts hosts(2);
  if (!hosts.why_not().empty()) GTEST_SKIP() << hosts.why_not();
  const auto root = make_temp_dir("netem");
  const std::string run = kRun + " --set max_steps=24 --set save_steps=2";
  const auto reference = nproc_steps(run, 2, root);
  ASSERT_EQ(reference.size(), 24u);

  const auto start = [&](const std::string& out, int port, int timeout_s) {
    for (int h = 0; h < 2; ++h) {
      start_on(hosts, h,
               fmt::format("{} --no-python {} {} --set dist_timeout={} --set output_dir={}",
                           static_agent(hosts, h, port), GRADACCUM_CLI, run, timeout_s, out),
               fmt::format("{}-host{}.log", out, h), fmt::format("{}-host{}.rc", out, h), 240);
    }
  };
  const auto logs = [](const std::string& out) {
    return read_text(out + "-host0.log") + read_text(out + "-host1.log");
  };
  {
    SCOPED_TRACE("delay and loss");
    const auto out = root + "/lossy";
    hosts.set_netem(1, "delay 20ms loss 5%");
    start(out, test_port() + 3, 60);
    EXPECT_EQ(wait_rc(out + "-host0.rc", std::chrono::seconds(240)), 0) << logs(out);
    EXPECT_EQ(wait_rc(out + "-host1.rc", std::chrono::seconds(30)), 0) << logs(out);
    hosts.set_netem(1, "");
    expect_same_steps(reference, steps_so_far(out), "lossy");
  }
  {
    SCOPED_TRACE("down for 3 s");
    const auto out = root + "/blip";
    start(out, test_port() + 4, 60);
    ASSERT_TRUE(wait_for_steps(
        out, [](const auto& s) { return s.size() >= 4; }, std::chrono::seconds(120), out + "-host0.rc"))
        << logs(out);
    hosts.set_link(1, false);
    std::this_thread::sleep_for(std::chrono::seconds(3));
    hosts.set_link(1, true);
    EXPECT_EQ(wait_rc(out + "-host0.rc", std::chrono::seconds(240)), 0) << logs(out);
    EXPECT_EQ(wait_rc(out + "-host1.rc", std::chrono::seconds(30)), 0) << logs(out);
    expect_same_steps(reference, steps_so_far(out), "blip");
  }
  {
    SCOPED_TRACE("down for good");
    const auto out = root + "/cut";
    constexpr int kTimeout = 8;
    start(out, test_port() + 5, kTimeout);
    ASSERT_TRUE(wait_for_steps(
        out, [](const auto& s) { return s.size() >= 4; }, std::chrono::seconds(120), out + "-host0.rc"))
        << logs(out);
    const auto cut_at = Clock::now();
    hosts.set_link(1, false);
    EXPECT_NE(wait_rc(out + "-host0.rc", std::chrono::seconds(kTimeout + 60)), 0) << logs(out);
    const double stopped_after_s = std::chrono::duration<double>(Clock::now() - cut_at).count();
    EXPECT_NE(wait_rc(out + "-host1.rc", std::chrono::seconds(30)), 0) << logs(out);
    hosts.set_link(1, true);
    // A collective waits dist_timeout; torchrun's agent then needs a few seconds to stop the other.
    EXPECT_LT(stopped_after_s, kTimeout + 30.0) << logs(out);
    const auto log0 = read_text(out + "-host0.log");
    EXPECT_NE(log0.find("stalled past dist_timeout"), std::string::npos) << log0;
    // Whatever was being saved when the link went is whole or absent; the latest resumes exactly.
    const auto resumed = run_cli(run + " --nproc 2 --set resume_from_checkpoint=auto --set output_dir=" + out);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_NE(resumed.out.find("resuming from"), std::string::npos) << resumed.out;
    expect_same_steps(reference, steps_so_far(out), "cut");
  }
  fs::remove_all(root);
}

}  // namespace multi_host_test
