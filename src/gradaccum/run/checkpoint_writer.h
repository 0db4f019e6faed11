// The checkpoint hook of a run: what the training loop hands over (its position and a partial
// window) plus what the run owns — the weights under their file names, the optimizer state, the
// configuration and the seed — written through io::CheckpointStore.
#pragma once

#include <string>
#include <vector>

#include "gradaccum/core/grad_sync.h"
#include "gradaccum/core/training_state.h"
#include "gradaccum/io/checkpoint.h"
#include "gradaccum/optim/optimizer_state.h"
#include "gradaccum/run/fit.h"

namespace gradaccum::run {

class CheckpointWriter final : public core::CheckpointHook {
 public:
  // `files` names the weights; rank 0 saves them, every rank its optimizer shard under ZeRO-1
  // (`optimizer_per_rank`), else rank 0 the whole optimizer.
  // `run_id` is recorded in every checkpoint (io/checkpoint.h, "Runs").
  CheckpointWriter(io::CheckpointStore& store, const ModelFiles& files, bool rank0, bool optimizer_per_rank,
                   std::string description, uint64_t seed, std::string run_id);

  void set_optimizer(torch::optim::Optimizer& optimizer, optim::NamedParameters parameters);
  // The gradient sync whose with_whole_parameters() a save runs in (ZeRO-3 gathers the weights);
  // null: the parameters are always whole.
  void set_parameter_source(core::GradSync* sync) { sync_ = sync; }
  // Files rank 0 copies into every checkpoint beside the weights (RunOptions::final_files).
  void set_extra_files(std::vector<std::string> files) { extra_files_ = std::move(files); }
  // save_on_error: continue. A periodic or the end's checkpoint that cannot be written is
  // reported (rank 0, one line) and the run goes on (to final/ at the end); a preemption's
  // checkpoint always stops the run with its error.
  void set_continue_after_failed_save(bool on) { continue_after_failed_save_ = on; }
  void save(const core::TrainingState& state, core::SaveReason reason) override;
  const std::string& last() const { return last_; }

 private:
  void write(const core::TrainingState& state);

  io::CheckpointStore& store_;
  const ModelFiles& files_;
  bool rank0_;
  bool optimizer_per_rank_;
  std::string description_;
  uint64_t seed_;
  std::string run_id_;
  torch::optim::Optimizer* optimizer_ = nullptr;
  core::GradSync* sync_ = nullptr;
  optim::NamedParameters parameters_;
  std::vector<std::string> extra_files_;
  bool continue_after_failed_save_ = false;
  std::string last_;
};

}  // namespace gradaccum::run
