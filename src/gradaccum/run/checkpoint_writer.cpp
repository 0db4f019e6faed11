#include "gradaccum/run/checkpoint_writer.h"

#include "gradaccum/base/check.h"
#include "gradaccum/dist/sharded_optimizer.h"

namespace gradaccum::run {

CheckpointWriter::CheckpointWriter(io::CheckpointStore& store, const ModelFiles& files, bool rank0,
                                   bool optimizer_per_rank, std::string description, uint64_t seed, std::string run_id)
    : store_(store),
      files_(files),
      rank0_(rank0),
      optimizer_per_rank_(optimizer_per_rank),
      description_(std::move(description)),
      seed_(seed),
      run_id_(std::move(run_id)) {}

void CheckpointWriter::set_optimizer(torch::optim::Optimizer& optimizer, optim::NamedParameters parameters) {
  optimizer_ = &optimizer;
  parameters_ = std::move(parameters);
}

void CheckpointWriter::save(const core::TrainingState& state, core::SaveReason reason) {
  try {
    if (sync_ != nullptr) {
      sync_->with_whole_parameters([&] { write(state); });
    } else {
      write(state);
    }
  } catch (const io::CheckpointNotSaved& e) {
    // A preempted run stops here: going on without its checkpoint would lose the work.
    if (!continue_after_failed_save_ || reason == core::SaveReason::preempted) throw;
    if (rank0_) fmt::print(stderr, "warning: {}; training goes on without it (save_on_error: continue)\n", e.what());
  }
}

void CheckpointWriter::write(const core::TrainingState& state) {
  GA_CHECK(optimizer_ != nullptr, "checkpoint: the writer has no optimizer to save");
  io::CheckpointContents contents;
  contents.state = state;
  if (rank0_) {
    contents.model = files_.weights();
    contents.model_config = files_.config;
    contents.model_file = files_.weights_file;
    contents.model_config_file = files_.config_file;
    contents.extra_files = extra_files_;
  }
  if (rank0_ || optimizer_per_rank_) contents.optimizer = dist::named_optimizer_state(*optimizer_, parameters_);
  contents.optimizer_per_rank = optimizer_per_rank_;
  contents.resolved_config = description_;
  contents.seed = seed_;
  contents.run_id = run_id_;
  last_ = store_.save(contents);
}

}  // namespace gradaccum::run
