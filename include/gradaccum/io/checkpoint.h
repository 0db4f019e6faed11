// Training checkpoints: `output_dir/checkpoints/step-K/`, one directory per
// saved step, that a reader either sees complete or not at all.
//
// Layout (format version 5):
//   model.safetensors        the weights (HF names where the model has them); a LoRA run
//                            writes its adapters as adapter_model.safetensors instead
//   config.json              the model's HF config, where it has one (a LoRA run's:
//                            adapter_config.json)
//   tokenizer files          a language model's (tokenizer.json, gpt2.tiktoken, ...), as in
//                            final/: the checkpoint loads with HF's from_pretrained on its own
//   optimizer.safetensors    optimizer state under parameter names
//                            (optim/optimizer_state.h); under ZeRO-1 one
//                            optimizer-rank<R>.safetensors per rank, its shard
//   state.safetensors        tensors of the loop: the CPU RNG state
//   window-rank<R>.safetensors  rank R's tensors of the pieces, as "<piece>.<name>";
//                            only where a piece has some: a window interrupted by
//                            preemption (preemption.micro_step, .grad_count,
//                            .totals, .micro_items, .grad.<i>; ranks may have stopped
//                            after different micro-steps, core/stop_agreement.h)
//   trainer_state.json       format_version, the position (step, LR schedule
//                            step, epoch, window, rank 0's micro-step, running
//                            sums), "pieces": {"<piece>": {"<name>": value}} with
//                            every piece's scalars (an int64, a number, true/false
//                            or a string: geometry's b×N×W, global batch and
//                            window_tokens; loss_scaling's scale and growth
//                            tracker under fp16; oom_recovery's
//                            micro_batch_from_oom_recovery), seed, the resolved
//                            configuration, and the run's id (below)
//   manifest.json            size and CRC-32 of every file above, written last
//
// The pieces' state is written and read by name (core/piece_state.h): what a field
// means, and whether it is valid, is its piece's, which spells it once.
//
// Atomicity: every rank writes its files into `checkpoints/.tmp-step-K/`, each
// file fsynced; after a barrier that tells every rank whether all parts were
// written, rank 0 writes the manifest, fsyncs the directory and renames it to
// `step-K`. A part that could not be written (a full disk) publishes nothing. A crash at any moment leaves either the
// previous checkpoints alone or a `.tmp-*` directory that readers ignore and
// the next save removes. Corruption after the fact (a truncated or flipped
// file) is caught by the manifest's checksums, not by a crash in a parser.
//
// Runs: a run has an id, written to `output_dir/run.json` when it starts and
// recorded in every checkpoint it saves; a resumed run keeps the id of the
// checkpoint it continues. "latest" and save_total_limit consider only the
// checkpoints of output_dir's run (and those saved before run ids existed), so
// checkpoints left by another run in a reused output_dir are never resumed.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gradaccum/core/training_state.h"
#include "gradaccum/formats/safetensors.h"

namespace gradaccum::io {

// 2: schedule_step, loss_scaler; 3: the partial window per rank; 4: the optimizer state in
// safetensors under parameter names (before: a libtorch 1.13 archive keyed by pointer); 5: the
// trainer's state as its pieces' own (trainer_state.json's "pieces", "<piece>.<name>" tensors).
// Only the current version is read.
inline constexpr int kCheckpointFormatVersion = 5;

// What one rank contributes to a checkpoint.
struct CheckpointContents {
  core::TrainingState state;
  formats::NamedTensors model;  // rank 0 only (every rank holds the same weights)
  nlohmann::json model_config;  // null: no config.json
  // Their files' names: a LoRA run's are PEFT's adapter_model.safetensors and adapter_config.json.
  std::string model_file = "model.safetensors";
  std::string model_config_file = "config.json";
  // The optimizer state (optim::optimizer_state: the tensors themselves, not copies), written
  // by the ranks that save one: rank 0, or every rank under ZeRO-1.
  std::optional<formats::NamedTensors> optimizer;
  bool optimizer_per_rank = false;  // ZeRO-1: every rank saves its own shard
  std::string resolved_config;      // the run's YAML
  // Files rank 0 copies in beside the model (a language model's tokenizer files, so that a
  // checkpoint loads in HF's from_pretrained and in `gradaccum eval` / `generate` on its own).
  std::vector<std::string> extra_files;
  uint64_t seed = 0;
  std::string run_id;  // the run that saves it ("" = none recorded)
};

// A checkpoint as read back, for one rank.
struct LoadedCheckpoint {
  std::string directory;
  core::TrainingState state;
  formats::NamedTensors model;
  std::string model_file;           // the file `model` was read from (model.safetensors or adapter_model.safetensors)
  formats::NamedTensors optimizer;  // this rank's optimizer state file (optim::load_optimizer_state)
  // The optimizer files as saved: 0 for one whole state (optimizer.safetensors), W for one shard
  // per rank (optimizer-rank<R>.safetensors, ZeRO-1/2).
  int64_t optimizer_shards = 0;
  // When the run reading it holds its optimizer state in another layout: every optimizer file,
  // in rank order, to be joined and cut (dist/optimizer_reshard.h); `optimizer` is then empty.
  std::vector<formats::NamedTensors> optimizer_parts;
  torch::Tensor rng_state;  // the CPU generator's state (uint8)
  std::string resolved_config;
  uint64_t seed = 0;
  std::string run_id;  // "" for a checkpoint saved before run ids existed
};

struct CheckpointStoreOptions {
  std::string output_dir;
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t save_total_limit = 0;  // > 0: keep only the newest K checkpoints
  // Whether every rank's `ok` is true (a collective every rank makes: a barrier that carries each
  // rank's success); unused with one process.
  std::function<bool(bool ok)> all_ok;
};

// A checkpoint that could not be written on some rank (a full disk, a write error): nothing of it
// was published, earlier checkpoints are as they were, and every rank throws it.
class CheckpointNotSaved : public Error {
 public:
  using Error::Error;
};

class CheckpointStore {
 public:
  // Rank 0 removes `.tmp-*` directories left by a save that a crash cut short.
  explicit CheckpointStore(CheckpointStoreOptions options);

  // Writes this rank's part of step-K (K = contents.state.position.step) and,
  // on rank 0, publishes it. Returns the final directory.
  std::string save(const CheckpointContents& contents);

  const std::string& root() const { return root_; }

 private:
  CheckpointStoreOptions options_;
  std::string root_;  // output_dir/checkpoints
};

// A fresh run id: 16 hexadecimal digits, random.
std::string new_run_id();

// The id in output_dir/run.json; "" when there is none (an output_dir of a run
// older than run ids, or none yet). Throws naming the file when it is malformed.
std::string read_run_id(const std::string& output_dir);

// Writes output_dir/run.json (atomically) naming `run_id`.
void write_run_id(const std::string& output_dir, const std::string& run_id);

// The newest step-K directory under output_dir/checkpoints, complete or not; "" when none.
std::string newest_checkpoint_directory(const std::string& output_dir);

struct CheckpointChoice {
  std::string directory;
  // What "latest" passed over that was newer than its choice, one line each
  // (a step without its manifest, a checkpoint of another run).
  std::vector<std::string> notes;
};

// `spec` is a checkpoint directory, or "latest": the newest complete
// checkpoint of output_dir's run (read_run_id) under output_dir/checkpoints, or
// "auto": latest's choice, or an empty directory (a fresh start) where latest
// would find none. Throws naming what is missing.
CheckpointChoice choose_checkpoint(const std::string& spec, const std::string& output_dir);

// choose_checkpoint(...).directory.
std::string resolve_checkpoint(const std::string& spec, const std::string& output_dir);

// Reads and verifies (manifest checksums, format version) rank `rank`'s view of
// a checkpoint. Every problem is a one-line gradaccum::Error naming the file; the
// pieces' fields are checked by the pieces as they restore (their messages name the
// file too: state.scalars_file, state.tensors_file).
// `optimizer_shards`: the layout of the run that reads it, as LoadedCheckpoint::optimizer_shards
// counts; another than the saved one fills optimizer_parts instead of optimizer.
// kOtherOptimizerLayout: a layout no checkpoint was saved in (ZeRO-3 cuts per unit), so every
// optimizer file is read into optimizer_parts.
inline constexpr int64_t kOtherOptimizerLayout = -1;
LoadedCheckpoint read_checkpoint(const std::string& directory, int64_t rank, int64_t optimizer_shards = 0);

}  // namespace gradaccum::io
