#include "test_support.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_set>
#include <vector>

#include "gradaccum/core/trainer.h"
#include "gradaccum/data/tokenizer.h"
#include "gradaccum/dist/bucketed_grad_sync.h"
#include "gradaccum/models/networks.h"
#include "gradaccum/models/tasks.h"

namespace gradaccum::testing {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(read_text(path));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

std::vector<nlohmann::json> step_records(const std::string& metrics_path) {
  std::vector<nlohmann::json> steps;
  for (const auto& line : read_jsonl(metrics_path)) {
    if (line.contains("loss")) steps.push_back(line);
  }
  return steps;
}

std::vector<nlohmann::json> train_steps(const std::string& args, const std::string& out) {
  const auto r = run_cli("train " + args + " --set output_dir=" + out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return step_records(out + "/metrics.jsonl");
}

int rank_pid(int launcher, int rank) {
  const auto marker = "RANK=" + std::to_string(rank) + std::string(1, '\0');
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const auto name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto stat = read_text(entry.path().string() + "/stat");
    if (stat.find(')') == std::string::npos) continue;  // the process is gone
    std::istringstream fields(stat.substr(stat.find(')') + 2));
    std::string state;
    int ppid = 0;
    fields >> state >> ppid;
    if (ppid != launcher) continue;
    // "RANK=" preceded by the start of the block or a NUL: not LOCAL_RANK=.
    const auto environ = std::string(1, '\0') + read_text(entry.path().string() + "/environ");
    if (environ.find(std::string(1, '\0') + marker) != std::string::npos) return std::stoi(name);
  }
  return -1;
}

namespace {

// The directories make_temp_dir made in this process, removed when it exits (each test runs in
// a process of its own under ctest), so that test runs do not fill the temp dir.
// GRADACCUM_KEEP_TEST_DIRS=1 keeps them for a look after a failure.
class TempDirs {
 public:
  void add(const std::filesystem::path& dir) {
    std::lock_guard<std::mutex> lock(mutex_);
    dirs_.push_back(dir);
  }
  ~TempDirs() {
    const char* keep = std::getenv("GRADACCUM_KEEP_TEST_DIRS");
    if (keep != nullptr && *keep != '\0' && std::string(keep) != "0") return;
    std::error_code ignored;
    for (const auto& dir : dirs_) std::filesystem::remove_all(dir, ignored);
  }

 private:
  std::mutex mutex_;
  std::vector<std::filesystem::path> dirs_;
};

TempDirs& temp_dirs() {
  static TempDirs dirs;
  return dirs;
}

}  // namespace

std::string make_temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("gradaccum-test-" + std::to_string(getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  temp_dirs().add(dir);
  return dir.string();
}

SharedReference shared_reference(const std::string& name, const std::vector<std::string>& inputs,
                                 const std::function<std::string(const std::string& dir)>& command) {
  namespace fs = std::filesystem;
  // The key: the command (with a placeholder for the directory) and the bytes of its inputs.
  std::string keyed = command("DIR");
  for (const auto& input : inputs) keyed += '\0' + input + '\0' + read_text(input);
  std::ostringstream key;
  key << name << '-' << std::hex << std::hash<std::string>{}(keyed);
  const fs::path root = GRADACCUM_TEST_REFERENCES;
  fs::create_directories(root);
  const fs::path dir = root / key.str();
  // One maker at a time per key; the others wait, then read what it left.
  const int lock = ::open((root / (key.str() + ".lock")).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock < 0) return {"", "cannot open the lock of " + dir.string()};
  ::flock(lock, LOCK_EX);
  SharedReference made{dir.string(), ""};
  if (!fs::exists(dir)) {
    const fs::path partial = root / (key.str() + ".tmp-" + std::to_string(getpid()));
    fs::remove_all(partial);
    fs::create_directories(partial);
    const std::string shell = command(partial.string()) + " > '" + partial.string() + "/log' 2>&1";
    if (std::system(shell.c_str()) == 0) {
      fs::rename(partial, dir);
    } else {
      const std::string log = read_text((partial / "log").string());
      made.error = "failed: " + command("DIR") + "\n" + (log.size() > 2000 ? log.substr(log.size() - 2000) : log);
      fs::remove_all(partial);
    }
  }
  ::flock(lock, LOCK_UN);
  ::close(lock);
  return made;
}

std::string venv_program(const std::string& name) {
  const char* env = std::getenv("GRADACCUM_VENV");
  return std::string(env != nullptr && *env != '\0' ? env : "/opt/gradaccum/venv") + "/bin/" + name;
}

std::string gpt2_tokenizer_dir() {
  const char* env = std::getenv("GRADACCUM_TOKENIZER_DIR");
  return env != nullptr && *env != '\0' ? env : data::kDefaultTokenizerDir;
}

CliResult run_cli(const std::string& args, const std::string& cwd, const std::string& before) {
  static int counter = 0;
  const auto dir = make_temp_dir("cli-" + std::to_string(counter++));
  const auto out_path = dir + "/stdout";
  const auto err_path = dir + "/stderr";
  std::string command;
  if (!cwd.empty()) command += "cd '" + cwd + "' && ";
  if (!before.empty()) command += before + " && ";
  command += std::string("'") + GRADACCUM_CLI + "' " + args + " > '" + out_path + "' 2> '" + err_path + "' < /dev/null";
  const int status = std::system(command.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_text(out_path);
  r.err = read_text(err_path);
  std::filesystem::remove_all(dir);
  return r;
}

core::TrainerOptions seed000_options(int64_t b, int64_t n, int64_t steps) {
  core::TrainerOptions o;
  o.per_device_train_batch_size = b;
  o.gradient_accumulation_steps = n;
  o.max_steps = steps;
  o.optimizer.learning_rate = 1e-2;
  o.max_grad_norm = 0.5;
  o.dtype = torch::kDouble;
  return o;
}

Trajectory train_seed000_mlp(int64_t b, int64_t n, int64_t samples, int64_t steps, const torch::Device& device,
                             const c10::intrusive_ptr<c10d::Backend>& group, int64_t bucket_bytes) {
  torch::manual_seed(0);
  auto x = torch::randn({samples, 16}, torch::kDouble);
  auto y = torch::randn({samples, 1}, torch::kDouble);
  TensorDataset data(x, y);
  torch::manual_seed(1);
  models::Regressor model(models::seed000_mlp());
  auto o = seed000_options(b, n, steps);
  o.warmup_steps = 2;
  o.device = device;
  struct Collect final : core::TrainingObserver {
    void on_step(const core::StepRecord& r) override {
      t.loss.push_back(r.loss);
      t.grad_norm.push_back(r.grad_norm);
    }
    Trajectory t;
  } collect;
  // As the program does: the reducer hooks onto the parameters in their final device and dtype.
  std::unique_ptr<dist::BucketedGradSync> sync;
  if (group) {
    model.module().to(device, torch::kDouble);
    dist::GradSyncOptions sync_options;
    sync_options.bucket_bytes = bucket_bytes;
    sync = std::make_unique<dist::BucketedGradSync>(group, model.module().parameters(), sync_options);
  }
  core::Trainer trainer(o, model, data, nullptr, collect, sync.get());
  trainer.run();
  collect.t.weights = flat_params(model.module()).cpu();
  if (sync) {
    collect.t.allreduce_calls = sync->allreduce_calls();
    collect.t.buckets = sync->buckets();
  }
  return collect.t;
}

std::vector<int> count_autograd_nodes(const torch::Tensor& t, const std::vector<std::string>& names) {
  std::vector<int> counts(names.size(), 0);
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  if (t.grad_fn()) stack.push_back(t.grad_fn().get());
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    const std::string name = node->name();
    for (size_t i = 0; i < names.size(); ++i)
      if (name.rfind(names[i], 0) == 0 || name.find("::" + names[i]) != std::string::npos) ++counts[i];
    for (const auto& edge : node->next_edges())
      if (edge.function) stack.push_back(edge.function.get());
  }
  return counts;
}

std::vector<std::string> split_lines(const std::string& bytes) {
  std::vector<std::string> lines;
  for (std::size_t pos = 0; pos < bytes.size();) {
    std::size_t end = bytes.find('\n', pos);
    if (end == std::string::npos) end = bytes.size();
    lines.push_back(bytes.substr(pos, end - pos));
    pos = end + 1;
  }
  return lines;
}

}  // namespace gradaccum::testing
