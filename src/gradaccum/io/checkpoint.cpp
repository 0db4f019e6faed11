#include "gradaccum/io/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <variant>

#include "gradaccum/base/check.h"
#include "gradaccum/base/files.h"

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

// A rank's own tensors of the pieces: a partially accumulated window's (format 3 on).
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

// Every piece's scalars by name, into trainer_state.json's "pieces".
nlohmann::json pieces_json(const core::TrainingState& state) {
  nlohmann::json pieces = nlohmann::json::object();
  for (const auto& [piece, entry] : state.pieces) {
    auto& fields = pieces[piece] = nlohmann::json::object();
    for (const auto& [name, value] : entry.scalars) {
      std::visit(
          [&fields, &piece = piece, &name = name](const auto& v) {
            if constexpr (std::is_same_v<std::decay_t<decltype(v)>, double>) {
              // JSON has no inf or nan (nlohmann would write null).
              GA_CHECK(std::isfinite(v), "checkpoint: piece '{}' field '{}' is {}, which JSON cannot hold", piece, name,
                       v);
            }
            fields[name] = v;
          },
          value);
    }
  }
  return pieces;
}

// Every piece's tensors of this rank, as "<piece>.<name>".
formats::NamedTensors piece_tensors(const core::TrainingState& state) {
  formats::NamedTensors tensors;
  for (const auto& [piece, entry] : state.pieces) {
    for (const auto& [name, tensor] : entry.tensors) tensors.emplace_back(piece + "." + name, tensor);
  }
  return tensors;
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

  // Each phase runs on every rank; a failure (a full disk, a write error) is kept, and the ranks
  // learn whether all of them succeeded before the next phase, so none waits in a collective for a
  // rank that gave up, and nothing is published unless every part is in place.
  std::string failure;
  const auto attempt = [&](const auto& phase) {
    if (!failure.empty()) return;
    try {
      phase();
    } catch (const std::exception& e) {
      failure = e.what();
    }
  };
  const auto every_rank_succeeded = [&] {
    const bool ok = failure.empty();
    return options_.world_size > 1 && options_.all_ok ? options_.all_ok(ok) : ok;
  };
  const auto give_up = [&] {
    if (rank0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);  // never published; what it holds would only fill the disk further
    }
    throw CheckpointNotSaved(
        fmt::format("checkpoint {} not saved: {}", final_dir.string(),
                    failure.empty() ? "another rank could not write its part (its own error says why)" : failure));
  };

  attempt([&] {
    if (!rank0) return;
    fs::create_directories(root);
    // Left over from a crash during an earlier save: never published, safe to drop.
    for (const auto& entry : fs::directory_iterator(root)) {
      if (entry.path().filename().string().rfind(".tmp-", 0) == 0) fs::remove_all(entry.path());
    }
    fs::create_directories(tmp);
  });
  if (!every_rank_succeeded()) give_up();

  attempt([&] {
    if (c.optimizer_per_rank || rank0) {
      GA_CHECK(c.optimizer.has_value(), "checkpoint: rank {} has no optimizer state to save", options_.rank);
      formats::save_safetensors((tmp / optimizer_file(c.optimizer_per_rank, options_.rank)).string(), *c.optimizer);
    }
    if (rank0) {
      formats::save_safetensors((tmp / c.model_file).string(), c.model);
      if (!c.model_config.is_null()) {
        base::write_file_atomically((tmp / c.model_config_file).string(), c.model_config.dump(2) + "\n");
      }
      for (const auto& file : c.extra_files) {
        base::copy_file_atomically(file, (tmp / fs::path(file).filename()).string());
      }
      formats::save_safetensors((tmp / kStateTensors).string(),
                                {{"rng.cpu", at::detail::getDefaultCPUGenerator().get_state()}});
      nlohmann::json trainer_state = {{"format_version", kCheckpointFormatVersion},
                                      {"position", position_json(c.state.position)},
                                      {"pieces", pieces_json(c.state)},
                                      {"seed", c.seed},
                                      {"optimizer_per_rank", c.optimizer_per_rank},
                                      {"config", c.resolved_config},
                                      {"run_id", c.run_id}};
      base::write_file_atomically((tmp / kTrainerState).string(), trainer_state.dump(2) + "\n");
    }
    if (auto tensors = piece_tensors(c.state); !tensors.empty()) {
      formats::save_safetensors((tmp / window_file(options_.rank)).string(), tensors);
    }
  });
  // Every rank's files are durable (each written file is fsynced) before the manifest exists: a
  // rank lost here leaves a .tmp- directory that no reader picks.
  if (!every_rank_succeeded()) give_up();

  bool published = false;
  attempt([&] {
    if (!rank0) return;
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
    published = true;
  });
  if (!every_rank_succeeded()) give_up();  // published before any rank moves on

  if (rank0 && published && options_.save_total_limit > 0) {
    // This run's checkpoints only: another run's in a reused output_dir are not its to rotate. A
    // rotation that fails leaves one checkpoint too many, not a broken one.
    try {
      std::vector<fs::path> own;
      for (const auto& [k, dir] : step_directories(root)) {
        if (is_complete(dir) && of_run(dir, c.run_id)) own.push_back(dir);
      }
      const auto excess = static_cast<int64_t>(own.size()) - options_.save_total_limit;
      for (int64_t i = 0; i < excess; ++i) remove_checkpoint(own[static_cast<size_t>(i)]);
    } catch (const std::exception& e) {
      fmt::print(stderr, "warning: save_total_limit: an older checkpoint could not be removed: {}\n", e.what());
    }
  }
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
  if (spec != "latest" && spec != "auto") {
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
          "resume_from_checkpoint={}: {} has no manifest.json (a save that did not finish, or a damaged copy); "
          "passing over it",
          spec, dir.string()));
      continue;
    }
    ++complete;
    if (!of_run(dir, run_id)) {
      choice.notes.push_back(
          fmt::format("resume_from_checkpoint={}: {} is of another run (run id {}; {} names run {}); passing over it",
                      spec, dir.string(), run_id_of(dir), (fs::path(output_dir) / kRunFile).string(), run_id));
      continue;
    }
    choice.directory = dir.string();
    return choice;
  }
  if (spec == "auto") {
    // Nothing of this run to continue: a fresh start, under the rules of one.
    choice.notes.push_back(
        fmt::format("resume_from_checkpoint=auto: no checkpoint of this run under {}; a fresh start", root.string()));
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

LoadedCheckpoint read_checkpoint(const std::string& directory, int64_t rank, int64_t optimizer_shards) {
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
               ? "; versions before 5 keep the trainer's state outside trainer_state.json's pieces"
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
  // What no run reaches (an edited trainer_state.json); the limits that depend on the batch are
  // core::SavedGeometry::check_position_is_possible's.
  GA_CHECK(p.schedule_step <= p.step, "{}: schedule_step {} is beyond step {}", ts_what, p.schedule_step, p.step);
  GA_CHECK(p.window <= p.step, "{}: window {} is beyond the {} windows trained", ts_what, p.window, p.step);
  // The pieces' scalars, by name; what they mean is each piece's (core/piece_state.h).
  loaded.state.scalars_file = ts_what;
  const auto pieces = field<nlohmann::json>(ts, "pieces", ts_what);
  GA_CHECK(pieces.is_object(), "{}: 'pieces' is not an object", ts_what);
  for (const auto& [piece, fields] : pieces.items()) {
    GA_CHECK(fields.is_object(), "{}: 'pieces.{}' is not an object", ts_what, piece);
    auto& entry = loaded.state.piece(piece);
    for (const auto& [name, value] : fields.items()) {
      if (value.is_boolean()) {
        entry.set_flag(name, value.get<bool>());
      } else if (value.is_number_integer() &&
                 !(value.is_number_unsigned() && value.get<uint64_t>() > uint64_t{INT64_MAX})) {
        entry.set_integer(name, value.get<int64_t>());
      } else if (value.is_number_float()) {
        entry.set_real(name, value.get<double>());
      } else if (value.is_string()) {
        entry.set_text(name, value.get<std::string>());
      } else {
        throw Error(fmt::format("{}: field 'pieces.{}.{}' is not an int64, a number, true/false or a string", ts_what,
                                piece, name));
      }
    }
  }
  loaded.seed = field<uint64_t>(ts, "seed", ts_what);
  loaded.resolved_config = field<std::string>(ts, "config", ts_what);
  // Absent in checkpoints saved before run ids existed.
  if (ts.contains("run_id")) loaded.run_id = field<std::string>(ts, "run_id", ts_what);
  const bool per_rank = field<bool>(ts, "optimizer_per_rank", ts_what);
  if (per_rank) {
    for (const auto& [name, bytes] : contents) loaded.optimizer_shards += name.rfind("optimizer-rank", 0) == 0;
    GA_CHECK(loaded.optimizer_shards > 0,
             "checkpoint {}: no optimizer-rank<R>.safetensors, while {} says "
             "optimizer_per_rank",
             directory, kTrainerState);
    for (int64_t r = 0; r < loaded.optimizer_shards; ++r) {
      GA_CHECK(contents.count(optimizer_file(true, r)) > 0, "checkpoint {}: {} is missing of its {} optimizer shards",
               directory, optimizer_file(true, r), loaded.optimizer_shards);
    }
  }

  const auto state_tensors = formats::parse_safetensors(need(kStateTensors), what(kStateTensors));
  for (const auto& [name, tensor] : state_tensors) {
    if (name == "rng.cpu") loaded.rng_state = tensor;
  }
  // This rank's tensors of the pieces, as "<piece>.<name>" (each piece checks its own).
  const std::string window = window_file(rank);
  loaded.state.tensors_file = what(window.c_str());
  if (contents.count(window) > 0) {
    for (auto& [name, tensor] : formats::parse_safetensors(need(window), loaded.state.tensors_file)) {
      const auto dot = name.find('.');
      GA_CHECK(dot != std::string::npos && dot > 0, "{}: tensor '{}' names no piece", loaded.state.tensors_file, name);
      loaded.state.piece(name.substr(0, dot)).set_tensor(name.substr(dot + 1), std::move(tensor));
    }
  }
  // The weights of a whole model, or of LoRA adapters.
  loaded.model_file = contents.count(kModel) == 0 && contents.count(kAdapterModel) > 0 ? kAdapterModel : kModel;
  loaded.model = formats::parse_safetensors(need(loaded.model_file), what(loaded.model_file.c_str()));
  if (loaded.optimizer_shards == optimizer_shards) {
    const auto optimizer = optimizer_file(per_rank, rank);
    loaded.optimizer = formats::parse_safetensors(need(optimizer), what(optimizer.c_str()));
  } else {
    for (int64_t r = 0; r < std::max<int64_t>(1, loaded.optimizer_shards); ++r) {
      const auto optimizer = optimizer_file(per_rank, r);
      loaded.optimizer_parts.push_back(formats::parse_safetensors(need(optimizer), what(optimizer.c_str())));
    }
  }
  return loaded;
}

}  // namespace gradaccum::io
