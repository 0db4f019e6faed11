#include "gradaccum/io/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string_view>

#include "gradaccum/base/check.h"
#include "gradaccum/base/files.h"
#include "gradaccum/core/batch_geometry.h"

namespace gradaccum::io {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kTrainerState = "trainer_state.json";
constexpr const char* kStateTensors = "state.safetensors";
constexpr const char* kModel = "model.safetensors";
constexpr const char* kAdapterModel = "adapter_model.safetensors";
constexpr const char* kRunFile = "run.json";  // in output_dir

std::string step_name(int64_t step) { return fmt::format("step-{}", step); }

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  GA_CHECK(in.good(), "{}: cannot read", path.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// `crc` continued over `bytes`. zlib's crc32 takes uInt lengths: feed it in
// pieces for files over 4 GB.
uLong crc32_update(uLong crc, std::string_view bytes) {
  const auto* data = reinterpret_cast<const Bytef*>(bytes.data());
  size_t left = bytes.size();
  while (left > 0) {
    const auto piece = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
    crc = crc32(crc, data, piece);
    data += piece;
    left -= piece;
  }
  return crc;
}

uint32_t crc32_of(const std::string& bytes) { return static_cast<uint32_t>(crc32_update(crc32(0L, Z_NULL, 0), bytes)); }

// A rank's partially accumulated window (format 3; format 2 kept rank 0's in state.safetensors).
std::string window_file(int64_t rank) { return fmt::format("window-rank{}.safetensors", rank); }

// Size and CRC-32 of a file, read in pieces: the manifest of a large
// checkpoint must not hold a whole file in memory.
std::pair<uint64_t, uint32_t> file_size_and_crc32(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  GA_CHECK(in.good(), "{}: cannot read", path.string());
  std::vector<char> piece(1 << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t size = 0;
  while (in) {
    in.read(piece.data(), static_cast<std::streamsize>(piece.size()));
    const auto n = static_cast<size_t>(in.gcount());
    if (n == 0) break;
    crc = crc32_update(crc, std::string_view(piece.data(), n));
    size += n;
  }
  GA_CHECK(!in.bad(), "{}: read failed", path.string());
  return {size, static_cast<uint32_t>(crc)};
}

std::string optimizer_file(bool per_rank, int64_t rank) {
  return per_rank ? fmt::format("optimizer-rank{}.safetensors", rank) : std::string("optimizer.safetensors");
}

// Step K of a directory named step-K, or -1.
int64_t step_of(const fs::path& dir) {
  const auto name = dir.filename().string();
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return -1;
  int64_t k = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return -1;
    k = k * 10 + (c - '0');
  }
  return k;
}

// Deletes a published checkpoint without ever leaving a half-deleted step-K
// directory behind: remove_all deletes file by file, so a process killed
// during it would leave a step directory without its manifest, which no later
// save would count or remove. Renamed to a .tmp- name first (atomic), the
// remains of an interrupted deletion are dropped by the next save or resume.
void remove_checkpoint(const fs::path& dir) {
  const auto doomed = dir.parent_path() / (".tmp-delete-" + dir.filename().string());
  fs::remove_all(doomed);
  fs::rename(dir, doomed);
  fs::remove_all(doomed);
}

// The step-K directories under `root`, complete or not, oldest first.
std::vector<std::pair<int64_t, fs::path>> step_directories(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return found;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const auto k = step_of(entry.path());
    if (k >= 0 && entry.is_directory(ec)) found.emplace_back(k, entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

bool is_complete(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / kManifest, ec);
}

// The run id a checkpoint's trainer_state.json records; "" when it records none (or cannot be
// read: read_checkpoint reports that when it is chosen).
std::string run_id_of(const fs::path& dir) {
  std::ifstream in(dir / kTrainerState, std::ios::binary);
  if (!in.good()) return "";
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const auto ts = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (!ts.is_object() || !ts.contains("run_id") || !ts["run_id"].is_string()) return "";
  return ts["run_id"].get<std::string>();
}

// A checkpoint saved before run ids existed belongs to any run.
bool of_run(const fs::path& dir, const std::string& run_id) {
  if (run_id.empty()) return true;
  const auto id = run_id_of(dir);
  return id.empty() || id == run_id;
}

nlohmann::json position_json(const core::TrainingPosition& p) {
  return {{"step", p.step},
          {"schedule_step", p.schedule_step},
          {"epoch", p.epoch},
          {"window", p.window},
          {"micro_step", p.micro_step},
          {"loss_total", p.loss_total},
          {"samples", p.samples},
          {"items", p.items}};
}

// A position that no run reaches (an edited trainer_state.json) is refused before it is resumed:
// a run that trained `step` windows of at most B samples has seen at most step·B samples, and
// is in epoch step·B at the latest (every epoch holds at least one sample), at window `step` of
// it at the latest.
void check_position_is_possible(const core::TrainingState& state, const std::string& what) {
  const auto& p = state.position;
  core::BatchGeometry geometry = core::BatchGeometry::from_accumulation(1, 1);
  try {
    geometry = core::BatchGeometry::from_accumulation(state.micro_batch, state.accumulation_steps, state.world_size);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", what, e.what()));
  }
  GA_CHECK(state.global_batch == geometry.global_batch(),
           "{}: global_batch {} is not micro_batch x accumulation_steps "
           "x world_size = {}",
           what, state.global_batch, geometry.to_string());
  GA_CHECK(p.schedule_step <= p.step, "{}: schedule_step {} is beyond step {}", what, p.schedule_step, p.step);
  GA_CHECK(p.window <= p.step, "{}: window {} is beyond the {} windows trained", what, p.window, p.step);
  if (state.window_tokens > 0) {
    // Windows measured in tokens hold any number of samples, and never span two epochs.
    GA_CHECK(p.epoch <= p.step, "{}: epoch {} is impossible after {} windows", what, p.epoch, p.step);
    return;
  }
  // step + 1 windows: the samples of an interrupted window may be counted with the ones before.
  int64_t windows = 0, most = 0;
  if (__builtin_add_overflow(p.step, 1, &windows) || __builtin_mul_overflow(windows, state.global_batch, &most)) return;
  GA_CHECK(p.samples <= most, "{}: samples {} is more than {} windows of {} samples hold", what, p.samples, windows,
           state.global_batch);
  GA_CHECK(p.epoch <= most, "{}: epoch {} is impossible after {} windows of {} samples", what, p.epoch, p.step,
           state.global_batch);
}

template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& what) {
  GA_CHECK(j.is_object() && j.contains(key), "{}: missing field '{}'", what, key);
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(fmt::format("{}: field '{}' has the wrong type", what, key));
  }
}

}  // namespace

CheckpointStore::CheckpointStore(CheckpointStoreOptions options)
    : options_(std::move(options)), root_((fs::path(options_.output_dir) / "checkpoints").string()) {
  // A save cut short by a crash left a .tmp directory nobody will finish.
  std::error_code ec;
  if (options_.rank == 0 && fs::is_directory(root_, ec)) {
    for (const auto& entry : fs::directory_iterator(root_, ec)) {
      if (entry.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(entry.path(), ec);
    }
  }
}

std::string CheckpointStore::save(const CheckpointContents& c) {
  const bool rank0 = options_.rank == 0;
  const auto step = c.state.position.step;
  const fs::path root(root_);
  const fs::path final_dir = root / step_name(step);
  const fs::path tmp = root / (".tmp-" + step_name(step));
  auto barrier = [&] {
    if (options_.world_size > 1 && options_.barrier) options_.barrier();
  };

  if (rank0) {
    fs::create_directories(root);
    // Left over from a crash during an earlier save: never published, safe to drop.
    for (const auto& entry : fs::directory_iterator(root)) {
      if (entry.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(entry.path());
    }
    fs::create_directories(tmp);
  }
  barrier();

  if (c.optimizer_per_rank || rank0) {
    GA_CHECK(c.optimizer.has_value(), "checkpoint: rank {} has no optimizer state to save", options_.rank);
    formats::save_safetensors((tmp / optimizer_file(c.optimizer_per_rank, options_.rank)).string(), *c.optimizer);
  }
  if (rank0) {
    formats::save_safetensors((tmp / c.model_file).string(), c.model);
    if (!c.model_config.is_null()) {
      base::write_file_atomically((tmp / c.model_config_file).string(), c.model_config.dump(2) + "\n");
    }
    formats::save_safetensors((tmp / kStateTensors).string(),
                              {{"rng.cpu", at::detail::getDefaultCPUGenerator().get_state()}});
    nlohmann::json trainer_state = {
        {"format_version", kCheckpointFormatVersion},
        {"position", position_json(c.state.position)},
        {"micro_batch", c.state.micro_batch},
        {"accumulation_steps", c.state.accumulation_steps},
        {"micro_batch_from_oom_recovery", c.state.micro_batch_from_oom_recovery},
        {"world_size", c.state.world_size},
        {"global_batch", c.state.global_batch},
        {"window_tokens", c.state.window_tokens},
        {"loss_scaler", c.state.loss_scaler ? nlohmann::json{{"scale", c.state.loss_scaler->scale},
                                                             {"growth_tracker", c.state.loss_scaler->growth_tracker}}
                                            : nlohmann::json(nullptr)},
        {"seed", c.seed},
        {"optimizer_per_rank", c.optimizer_per_rank},
        {"config", c.resolved_config},
        {"run_id", c.run_id}};
    base::write_file_atomically((tmp / kTrainerState).string(), trainer_state.dump(2) + "\n");
  }
  if (c.state.position.micro_step > 0) {
    // Inside a window every rank keeps its own sums: ranks may have stopped
    // after different micro-steps, and their gradients differ until the
    // window's all-reduce.
    const auto long_scalar = [](int64_t v) { return torch::full({1}, v, torch::kLong); };
    formats::NamedTensors window{{"micro_step", long_scalar(c.state.position.micro_step)},
                                 {"grad_count", long_scalar(static_cast<int64_t>(c.state.partial.grads.size()))},
                                 {"totals", c.state.partial.totals}};
    if (c.state.partial.micro_items.defined()) window.emplace_back("micro_items", c.state.partial.micro_items);
    for (size_t i = 0; i < c.state.partial.grads.size(); ++i) {
      const auto& g = c.state.partial.grads[i];
      if (g.defined()) window.emplace_back(fmt::format("grad.{:05d}", i), g);
    }
    formats::save_safetensors((tmp / window_file(options_.rank)).string(), window);
  }
  barrier();  // every rank's files are in place

  if (rank0) {
    nlohmann::json files = nlohmann::json::object();
    for (const auto& entry : fs::directory_iterator(tmp)) {
      const auto [size, crc] = file_size_and_crc32(entry.path());
      files[entry.path().filename().string()] = {{"bytes", size}, {"crc32", crc}};
    }
    const nlohmann::json manifest = {{"format_version", kCheckpointFormatVersion}, {"files", files}};
    base::write_file_atomically((tmp / kManifest).string(), manifest.dump(2) + "\n");
    base::fsync_directory(tmp.string());
    // A rerun saving the same step swaps its new directory in; the old one is removed under the
    // temporary's name, whose remains the next save drops.
    base::replace_directory(tmp.string(), final_dir.string());

    if (options_.save_total_limit > 0) {
      // This run's checkpoints only: another run's in a reused output_dir are not its to rotate.
      std::vector<fs::path> own;
      for (const auto& [k, dir] : step_directories(root)) {
        if (is_complete(dir) && of_run(dir, c.run_id)) own.push_back(dir);
      }
      const auto excess = static_cast<int64_t>(own.size()) - options_.save_total_limit;
      for (int64_t i = 0; i < excess; ++i) remove_checkpoint(own[static_cast<size_t>(i)]);
    }
  }
  barrier();  // published before any rank moves on
  return final_dir.string();
}

std::string new_run_id() {
  std::random_device random;
  const uint64_t high = random(), low = random();
  return fmt::format("{:016x}", (high << 32) ^ low ^ static_cast<uint64_t>(::getpid()));
}

std::string read_run_id(const std::string& output_dir) {
  const auto path = fs::path(output_dir) / kRunFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return "";
  nlohmann::json run;
  try {
    run = nlohmann::json::parse(read_bytes(path));
  } catch (const nlohmann::json::exception&) {
    throw Error(fmt::format("{}: not valid JSON (remove it to start a new run there)", path.string()));
  }
  return field<std::string>(run, "run_id", path.string());
}

void write_run_id(const std::string& output_dir, const std::string& run_id) {
  base::write_file_atomically((fs::path(output_dir) / kRunFile).string(),
                              nlohmann::json{{"run_id", run_id}}.dump() + "\n");
}

std::string newest_checkpoint_directory(const std::string& output_dir) {
  const auto all = step_directories(fs::path(output_dir) / "checkpoints");
  return all.empty() ? "" : all.back().second.string();
}

CheckpointChoice choose_checkpoint(const std::string& spec, const std::string& output_dir) {
  if (spec != "latest") {
    GA_CHECK(fs::is_directory(spec), "key 'resume_from_checkpoint': {} is not a directory", spec);
    return {spec, {}};
  }
  const auto root = fs::path(output_dir) / "checkpoints";
  const auto run_id = read_run_id(output_dir);
  const auto all = step_directories(root);
  CheckpointChoice choice;
  int64_t complete = 0;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const auto& dir = it->second;
    if (!is_complete(dir)) {
      choice.notes.push_back(fmt::format(
          "resume_from_checkpoint=latest: {} has no manifest.json (a save that did not finish, or a damaged copy); "
          "passing over it",
          dir.string()));
      continue;
    }
    ++complete;
    if (!of_run(dir, run_id)) {
      choice.notes.push_back(fmt::format(
          "resume_from_checkpoint=latest: {} is of another run (run id {}; {} names run {}); passing over it",
          dir.string(), run_id_of(dir), (fs::path(output_dir) / kRunFile).string(), run_id));
      continue;
    }
    choice.directory = dir.string();
    return choice;
  }
  GA_CHECK(complete > 0, "key 'resume_from_checkpoint': latest: no complete checkpoint under {}", root.string());
  throw Error(fmt::format(
      "key 'resume_from_checkpoint': latest: no checkpoint under {} is of this output_dir's run {} ({} of other "
      "runs); name one as resume_from_checkpoint=DIR, or start afresh with overwrite_output_dir=true",
      root.string(), run_id, complete));
}

std::string resolve_checkpoint(const std::string& spec, const std::string& output_dir) {
  return choose_checkpoint(spec, output_dir).directory;
}

LoadedCheckpoint read_checkpoint(const std::string& directory, int64_t rank) {
  const fs::path dir(directory);
  const auto what = [&](const char* file) { return (dir / file).string(); };
  GA_CHECK(fs::is_directory(dir), "checkpoint {}: not a directory", directory);
  GA_CHECK(fs::exists(dir / kManifest),
           "checkpoint {}: no manifest.json (not a checkpoint, or one whose save did not finish)", directory);

  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(read_bytes(dir / kManifest));
  } catch (const nlohmann::json::exception&) {
    throw Error(fmt::format("{}: not valid JSON (corrupt checkpoint)", what(kManifest)));
  }
  const auto version = field<int64_t>(manifest, "format_version", what(kManifest));
  GA_CHECK(version == kCheckpointFormatVersion,
           "{}: format version {} is not supported (this build reads version {} only{})", what(kManifest), version,
           kCheckpointFormatVersion,
           version < kCheckpointFormatVersion
               ? "; versions before 4 hold the optimizer state in a libtorch 1.13 archive"
               : "");
  const auto files = field<nlohmann::json>(manifest, "files", what(kManifest));
  GA_CHECK(files.is_object(), "{}: 'files' is not an object", what(kManifest));

  // Every file is checked against the manifest before any parser sees it.
  std::map<std::string, std::string> contents;
  for (const auto& [name, info] : files.items()) {
    const auto path = dir / name;
    GA_CHECK(fs::exists(path), "checkpoint {}: {} is missing", directory, name);
    auto bytes = read_bytes(path);
    const auto expected_size = field<uint64_t>(info, "bytes", what(kManifest));
    GA_CHECK(bytes.size() == expected_size,
             "checkpoint {}: {} has {} bytes, the manifest says {} (truncated or corrupt)", directory, name,
             bytes.size(), expected_size);
    GA_CHECK(crc32_of(bytes) == field<uint32_t>(info, "crc32", what(kManifest)),
             "checkpoint {}: {} fails its CRC-32 check (corrupt)", directory, name);
    contents.emplace(name, std::move(bytes));
  }
  auto need = [&](const std::string& name) -> const std::string& {
    auto it = contents.find(name);
    GA_CHECK(it != contents.end(), "checkpoint {}: {} is not in the manifest", directory, name);
    return it->second;
  };

  LoadedCheckpoint loaded;
  loaded.directory = directory;
  nlohmann::json ts;
  try {
    ts = nlohmann::json::parse(need(kTrainerState));
  } catch (const nlohmann::json::exception&) {
    throw Error(fmt::format("{}: not valid JSON", what(kTrainerState)));
  }
  const auto ts_what = what(kTrainerState);
  GA_CHECK(field<int64_t>(ts, "format_version", ts_what) == version,
           "{}: its format version differs from the manifest's", ts_what);
  const auto pos = field<nlohmann::json>(ts, "position", ts_what);
  auto& p = loaded.state.position;
  p.step = field<int64_t>(pos, "step", ts_what);
  p.schedule_step = field<int64_t>(pos, "schedule_step", ts_what);
  p.epoch = field<int64_t>(pos, "epoch", ts_what);
  p.window = field<int64_t>(pos, "window", ts_what);
  p.micro_step = field<int64_t>(pos, "micro_step", ts_what);
  p.loss_total = field<double>(pos, "loss_total", ts_what);
  p.samples = field<int64_t>(pos, "samples", ts_what);
  p.items = field<int64_t>(pos, "items", ts_what);
  GA_CHECK(p.step >= 0 && p.schedule_step >= 0 && p.epoch >= 0 && p.window >= 0 && p.micro_step >= 0 &&
               p.samples >= 0 && p.items >= 0,
           "{}: negative position", ts_what);
  GA_CHECK(ts.is_object() && ts.contains("loss_scaler"), "{}: missing field 'loss_scaler'", ts_what);
  if (!ts.at("loss_scaler").is_null()) {
    const auto scaler = field<nlohmann::json>(ts, "loss_scaler", ts_what);
    loaded.state.loss_scaler = optim::LossScalerState{field<double>(scaler, "scale", ts_what),
                                                      field<int64_t>(scaler, "growth_tracker", ts_what)};
  }
  loaded.state.micro_batch = field<int64_t>(ts, "micro_batch", ts_what);
  loaded.state.accumulation_steps = field<int64_t>(ts, "accumulation_steps", ts_what);
  // Absent in checkpoints written before OOM recovery existed.
  loaded.state.micro_batch_from_oom_recovery = ts.value("micro_batch_from_oom_recovery", false);
  loaded.state.world_size = field<int64_t>(ts, "world_size", ts_what);
  loaded.state.global_batch = field<int64_t>(ts, "global_batch", ts_what);
  loaded.state.window_tokens = ts.value("window_tokens", int64_t{0});  // absent before token windows
  GA_CHECK(loaded.state.window_tokens >= 0, "{}: negative window_tokens", ts_what);
  check_position_is_possible(loaded.state, ts_what);
  loaded.seed = field<uint64_t>(ts, "seed", ts_what);
  loaded.resolved_config = field<std::string>(ts, "config", ts_what);
  // Absent in checkpoints saved before run ids existed.
  if (ts.contains("run_id")) loaded.run_id = field<std::string>(ts, "run_id", ts_what);
  const bool per_rank = field<bool>(ts, "optimizer_per_rank", ts_what);
  GA_CHECK(!per_rank || rank < loaded.state.world_size,
           "checkpoint {}: rank {} has no optimizer shard (saved by {} ranks with zero_stage 1)", directory, rank,
           loaded.state.world_size);
  GA_CHECK(p.micro_step == 0 || rank < loaded.state.world_size,
           "checkpoint {}: it was saved inside a window by {} ranks, so rank {} has no partial "
           "window; resume it with the same b x N x W",
           directory, loaded.state.world_size, rank);

  const auto state_tensors = formats::parse_safetensors(need(kStateTensors), what(kStateTensors));
  for (const auto& [name, tensor] : state_tensors) {
    if (name == "rng.cpu") loaded.rng_state = tensor;
  }
  if (p.micro_step > 0) {
    // The window's sums: each rank's in its own file, with its own micro-step.
    auto& partial = loaded.state.partial;
    const std::string file = window_file(rank);
    const auto tensors = formats::parse_safetensors(need(file), what(file.c_str()));
    const auto where = what(file.c_str());
    int64_t grad_count = -1;
    for (const auto& [name, tensor] : tensors) {
      if (name == "totals") partial.totals = tensor;
      if (name == "micro_items") partial.micro_items = tensor;
      if (name == "micro_step" || name == "grad_count") {
        GA_CHECK(tensor.scalar_type() == torch::kLong && tensor.numel() == 1, "{}: '{}' is not one int64", where, name);
        (name == "micro_step" ? p.micro_step : grad_count) = tensor.item<int64_t>();
      }
    }
    GA_CHECK(partial.totals.defined() && partial.totals.numel() == 3 && partial.totals.scalar_type() == torch::kDouble,
             "{}: the partial window's totals are missing or malformed", where);
    GA_CHECK(grad_count >= 0 && p.micro_step > 0, "{}: the partial window's {} is missing or negative", where,
             grad_count < 0 ? "grad_count" : "micro_step");
    GA_CHECK(!partial.micro_items.defined() ||
                 (partial.micro_items.dim() == 1 && partial.micro_items.numel() == p.micro_step &&
                  partial.micro_items.scalar_type() == torch::kDouble),
             "{}: the partial window's micro_items are not {} float64 counts", where, p.micro_step);
    partial.grads.resize(static_cast<size_t>(grad_count));
    const std::string grad_prefix = "grad.";
    for (const auto& [name, tensor] : tensors) {
      if (name.rfind(grad_prefix, 0) != 0) continue;
      const auto digits = name.substr(grad_prefix.size());
      GA_CHECK(!digits.empty() && digits.size() <= 9 && digits.find_first_not_of("0123456789") == std::string::npos,
               "{}: tensor {} has no gradient index", where, name);
      const auto index = std::stoll(digits);
      GA_CHECK(index < grad_count, "{}: {} is out of range", where, name);
      partial.grads[static_cast<size_t>(index)] = tensor;
    }
  }
  // The weights of a whole model, or of LoRA adapters.
  loaded.model_file = contents.count(kModel) == 0 && contents.count(kAdapterModel) > 0 ? kAdapterModel : kModel;
  loaded.model = formats::parse_safetensors(need(loaded.model_file), what(loaded.model_file.c_str()));
  const auto optimizer = optimizer_file(per_rank, rank);
  loaded.optimizer = formats::parse_safetensors(need(optimizer), what(optimizer.c_str()));
  return loaded;
}

}  // namespace gradaccum::io
