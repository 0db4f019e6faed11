#include "gradaccum/cli/plan_command.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "gradaccum/base/check.h"
#include "gradaccum/io/config.h"
#include "gradaccum/io/workload.h"

namespace gradaccum::cli {

namespace {

namespace fs = std::filesystem;

std::string shell_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// MemAvailable of /proc/meminfo in MB (0 when unreadable).
double available_mb() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("MemAvailable:", 0) == 0) return std::stod(line.substr(13)) / 1024.0;  // kB
  }
  return 0.0;
}

// What the limit holds back, for the plan's output.
std::string margin_note(const Plan& plan) {
  return plan.limit_given ? "--memory as given: no margin; a real run's peak can exceed its probe's by a few percent"
                          : "90% of the memory available: a 10% margin";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// One probe: the program in a child process, b × n for `steps` steps, longest samples first.
PlanCandidate probe(const PlanArgs& args, int64_t b, int64_t n, const fs::path& dir, bool cuda) {
  PlanCandidate c{core::BatchGeometry::from_accumulation(b, n)};
  const auto out = dir / fmt::format("b{}", b);
  std::string command = shell_quoted(fs::read_symlink("/proc/self/exe").string()) + " train";
  if (!args.config_path.empty()) command += " " + shell_quoted(args.config_path);
  for (const auto& o : args.overrides) command += " --set " + shell_quoted(o);
  for (const std::string o :
       {fmt::format("per_device_train_batch_size={}", b), fmt::format("gradient_accumulation_steps={}", n),
        std::string("global_batch_size=0"), fmt::format("max_steps={}", args.steps), std::string("save_steps=0"),
        std::string("eval_steps=0"), std::string("data.eval_limit=-1"),
        std::string("train_sampling_strategy=longest_first"), std::string("oom_recovery=false"),
        std::string("report_to=none"), std::string("grad_flow_steps=0"), std::string("profile_from_step=0"),
        std::string("sample.prompt="), "output_dir=" + out.string()}) {
    command += " --set " + shell_quoted(o);
  }
  command += " > " + shell_quoted((dir / fmt::format("b{}.out", b)).string()) + " 2> " +
             shell_quoted((dir / fmt::format("b{}.err", b)).string()) + " < /dev/null";
  const int status = std::system(command.c_str());
  if (status != 0) {
    std::string err = read_text(dir / fmt::format("b{}.err", b));
    while (!err.empty() && err.back() == '\n') err.pop_back();
    c.error = err.substr(err.rfind('\n') == std::string::npos ? 0 : err.rfind('\n') + 1);
    if (c.error.empty()) c.error = fmt::format("exit status {}", status);
    return c;
  }
  const auto summary = nlohmann::json::parse(read_text(out / "summary.json"), nullptr, false);
  GA_CHECK(summary.is_object(), "plan: the probe of micro-batch {} wrote no summary.json in {}", b, out.string());
  c.peak_mb = cuda ? summary.value("peak_device_mb", 0.0) : summary.value("peak_rss_mb", 0.0);
  std::vector<double> times;
  std::ifstream metrics(out / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step_time_s") && j.value("step", 0) > 1) times.push_back(j["step_time_s"]);
  }
  const double step_s = median(times);
  c.samples_per_s = step_s > 0.0 ? static_cast<double>(b * n) / step_s : 0.0;
  return c;
}

// The model's states as the sharded pieces cut them: its units, its root, what is frozen.
dist::ModelStates model_states(const io::TrainConfig& config) {
  auto workload = io::make_workload(config, /*with_eval=*/false);
  auto& task = *workload.model.task;
  dist::ModelStates states;
  states.element_bytes = static_cast<int64_t>(c10::elementSize(config.trainer.dtype));
  std::set<const void*> in_units;
  for (const auto& unit : task.units()) {
    int64_t elements = 0;
    for (const auto& p : unit) {
      elements += p.numel();
      in_units.insert(p.unsafeGetTensorImpl());
    }
    if (elements > 0) states.unit_elements.push_back(elements);
  }
  for (const auto& p : task.module().parameters()) {
    if (!p.requires_grad()) {
      states.frozen_bytes += p.numel() * static_cast<int64_t>(p.element_size());
    } else if (in_units.count(p.unsafeGetTensorImpl()) == 0) {
      states.root_elements += p.numel();
    }
  }
  const auto& optimizer = config.trainer.optimizer;
  states.moments = optimizer.type == optim::OptimizerType::sgd ? (optimizer.momentum > 0.0 ? 1 : 0) : 2;
  return states;
}

std::vector<RankStatesRow> rank_states_rows(const dist::ModelStates& states) {
  std::vector<RankStatesRow> rows;
  for (const int64_t world : {2, 4, 8}) {
    for (const int64_t stage : {0, 1, 2, 3}) {
      for (const auto policy : {dist::GradShardPolicy::defer, dist::GradShardPolicy::each_micro_step}) {
        if (stage < 2 && policy != dist::GradShardPolicy::defer) continue;
        rows.push_back({stage, stage < 2 ? std::string() : dist::grad_shard_policy_names().name(policy), world,
                        dist::rank_state_bytes(states, world, stage, policy)});
      }
    }
  }
  return rows;
}

constexpr double kMiB = 1024.0 * 1024.0;

int64_t trained_elements(const dist::ModelStates& states) {
  int64_t trained = states.root_elements;
  for (const int64_t u : states.unit_elements) trained += u;
  return trained;
}

void print_rank_states(const dist::ModelStates& states, const std::vector<RankStatesRow>& rows) {
  // With LoRA the frozen base is most of the weights and has no gradient or optimizer state.
  fmt::print("states: {} parameters trained ({} bytes each, {} optimizer moments), {:.1f} MB of frozen parameters\n",
             trained_elements(states), states.element_bytes, states.moments,
             static_cast<double>(states.frozen_bytes) / kMiB);
  fmt::print(
      "states per rank at W ranks, MB: weights + gradients + optimizer state held between micro-steps (+ the most "
      "a micro-step adds); activations apart\n");
  fmt::print("{:>10} {:>17} {:>16} {:>16} {:>16}\n", "zero_stage", "sharded_grad_sync", "W=2", "W=4", "W=8");
  const size_t per_world = rows.size() / 3;
  for (size_t i = 0; i < per_world; ++i) {
    std::string line = fmt::format("{:>10} {:>17}", rows[i].zero_stage, rows[i].policy.empty() ? "-" : rows[i].policy);
    for (size_t w = 0; w < 3; ++w) {
      const auto& b = rows[w * per_world + i].bytes;
      line += fmt::format(" {:>16}", fmt::format("{:.0f} (+{:.0f})", static_cast<double>(b.held()) / kMiB,
                                                 static_cast<double>(b.transient) / kMiB));
    }
    fmt::print("{}\n", line);
  }
}

}  // namespace

double parse_memory_mb(const std::string& text) {
  // MB here is 2^20 bytes, as the peaks are measured (peak_rss_mb); the SI and IEC spellings of a
  // unit mean the same size.
  static const std::regex size(R"(\s*([0-9]+(\.[0-9]+)?)\s*(|K|KB|KiB|M|MB|MiB|G|GB|GiB|T|TB|TiB)\s*)");
  std::smatch m;
  GA_CHECK(std::regex_match(text, m, size), "--memory: '{}' is not a size (e.g. 6000, 6000M, 8G)", text);
  const double value = std::stod(m[1].str());
  const char unit = m[3].str().empty() ? 'M' : m[3].str()[0];
  const double mb = unit == 'K'   ? value / 1024.0
                    : unit == 'M' ? value
                    : unit == 'G' ? value * 1024.0
                                  : value * 1048576.0;
  GA_CHECK(mb > 0.0, "--memory: '{}' is not a positive size", text);
  return mb;
}

Plan make_plan(const PlanArgs& args, bool quiet) {
  GA_CHECK(args.steps >= 2, "--steps must be >= 2 (the first step is not timed), got {}", args.steps);
  const auto config = io::load_config(args.config_path, args.overrides);
  const bool cuda = config.trainer.device.is_cuda();
  Plan plan;
  plan.global_batch = args.global_batch > 0 ? args.global_batch : config.trainer.geometry(1).global_batch();
  try {
    core::BatchGeometry::from_global(1, plan.global_batch);  // refuses one beyond the largest, naming it
  } catch (const Error& e) {
    throw Error(fmt::format("--global-batch: {}", e.what()));
  }
  plan.memory_kind = cuda ? "CUDA peak allocated" : "peak RSS";
  GA_CHECK(args.global_batch >= 0, "--global-batch must be >= 1, got {}", args.global_batch);
  // A probe's peak is compared with the limit as it is: an explicit --memory keeps no margin (a real
  // run's peak differs from its probe's by a few percent), the default keeps 10% of what is available.
  plan.limit_given = !args.memory.empty();
  plan.limit_mb = plan.limit_given ? parse_memory_mb(args.memory) : 0.9 * available_mb();
  GA_CHECK(plan.limit_mb > 0.0, "plan: cannot read the available memory from /proc/meminfo; give --memory");
  GA_CHECK(!cuda || !args.memory.empty(), "plan: with device: cuda give --memory (the GPU's memory to use)");

  const fs::path dir = fs::temp_directory_path() / fmt::format("gradaccum-plan-{}", getpid());
  fs::create_directories(dir);
  if (!quiet) {
    fmt::print(
        "plan: global batch {} (unchanged), memory limit {:.0f} MB of {} ({}), {} steps per probe, longest samples "
        "first\n",
        plan.global_batch, plan.limit_mb, plan.memory_kind, margin_note(plan), args.steps);
    fmt::print("{:>6} {:>6} {:>12} {:>12}  {}\n", "b", "N", "peak MB", "samples/s", "");
  }
  for (int64_t b = 1; b <= plan.global_batch; ++b) {
    if (plan.global_batch % b != 0) continue;
    auto c = probe(args, b, plan.global_batch / b, dir, cuda);
    c.fits = c.error.empty() && c.peak_mb <= plan.limit_mb;
    if (!quiet) {
      if (!c.error.empty()) {
        fmt::print("{:>6} {:>6} {:>12} {:>12}  failed: {}\n", b, c.geometry.accumulation_steps(), "-", "-", c.error);
      } else {
        fmt::print("{:>6} {:>6} {:>12.0f} {:>12.3g}  {}\n", b, c.geometry.accumulation_steps(), c.peak_mb,
                   c.samples_per_s, c.fits ? "fits" : "over the limit");
      }
      std::fflush(stdout);
    }
    plan.candidates.push_back(c);
    if (!c.fits) break;  // a larger micro-batch needs more
  }
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  plan.states = model_states(config);
  plan.rank_states = rank_states_rows(plan.states);
  if (!quiet) print_rank_states(plan.states, plan.rank_states);

  double fastest = 0.0;
  for (const auto& c : plan.candidates) {
    if (c.fits) fastest = std::max(fastest, c.samples_per_s);
  }
  for (const auto& c : plan.candidates) {
    if (c.fits && c.samples_per_s >= 0.95 * fastest) plan.choice = c;  // the largest b among the fastest
  }
  return plan;
}

int run_plan(const PlanArgs& args) {
  const auto plan = make_plan(args, args.json);
  if (args.json) {
    nlohmann::json candidates = nlohmann::json::array();
    for (const auto& c : plan.candidates) {
      nlohmann::json j = {{"micro_batch", c.geometry.micro_batch()},
                          {"gradient_accumulation_steps", c.geometry.accumulation_steps()},
                          {"peak_mb", c.peak_mb},
                          {"samples_per_s", c.samples_per_s},
                          {"fits", c.fits}};
      if (!c.error.empty()) j["error"] = c.error;
      candidates.push_back(j);
    }
    nlohmann::json choice = nullptr;
    if (plan.choice) {
      choice = {{"per_device_train_batch_size", plan.choice->geometry.micro_batch()},
                {"gradient_accumulation_steps", plan.choice->geometry.accumulation_steps()}};
    }
    nlohmann::json states = nlohmann::json::array();
    for (const auto& row : plan.rank_states) {
      states.push_back({{"zero_stage", row.zero_stage},
                        {"sharded_grad_sync", row.policy},
                        {"world_size", row.world_size},
                        {"parameters_bytes", row.bytes.parameters},
                        {"gradients_bytes", row.bytes.gradients},
                        {"optimizer_bytes", row.bytes.optimizer},
                        {"transient_bytes", row.bytes.transient}});
    }
    fmt::print("{}\n", nlohmann::json{{"global_batch", plan.global_batch},
                                      {"limit_mb", plan.limit_mb},
                                      {"limit_margin", margin_note(plan)},
                                      {"memory", plan.memory_kind},
                                      {"candidates", candidates},
                                      {"choice", choice},
                                      {"trained_parameters", trained_elements(plan.states)},
                                      {"frozen_bytes", plan.states.frozen_bytes},
                                      {"states_per_rank", states}}
                           .dump());
  } else if (plan.choice) {
    fmt::print(
        "choice: per_device_train_batch_size={} gradient_accumulation_steps={} (global batch {}, peak {:.0f} MB of "
        "{:.0f}{})\n",
        plan.choice->geometry.micro_batch(), plan.choice->geometry.accumulation_steps(), plan.global_batch,
        plan.choice->peak_mb, plan.limit_mb, plan.limit_given ? ", no margin" : "");
  }
  if (!plan.choice) {
    const auto& first = plan.candidates.front();
    const std::string need = first.error.empty() ? fmt::format("micro-batch 1 needs {:.0f} MB", first.peak_mb)
                                                 : fmt::format("micro-batch 1 failed: {}", first.error);
    fmt::print(
        stderr,
        "gradaccum: error: no micro-batch of global batch {} fits in {:.0f} MB: {} (the global batch is not changed)\n",
        plan.global_batch, plan.limit_mb, need);
    return 1;
  }
  return 0;
}

}  // namespace gradaccum::cli
