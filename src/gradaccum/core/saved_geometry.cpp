#include "gradaccum/core/saved_geometry.h"

#include "gradaccum/base/check.h"

namespace gradaccum::core {

void SavedGeometry::save(TrainingState& state) const {
  auto& piece = state.piece(kPiece);
  piece.set_integer("micro_batch", geometry.micro_batch());
  piece.set_integer("accumulation_steps", geometry.accumulation_steps());
  piece.set_integer("world_size", geometry.world_size());
  piece.set_integer("global_batch", geometry.global_batch());  // for the reader: b × N × W
  piece.set_integer("window_tokens", window_tokens);
}

SavedGeometry SavedGeometry::restore(const TrainingState& state) {
  const auto piece = state.saved_piece(kPiece);
  const auto micro_batch = piece.integer("micro_batch");
  const auto accumulation_steps = piece.integer("accumulation_steps");
  const auto world_size = piece.integer("world_size");
  const auto global_batch = piece.integer("global_batch");
  const auto window_tokens = piece.integer("window_tokens");
  SavedGeometry saved{BatchGeometry::from_accumulation(1, 1), window_tokens};
  try {
    saved.geometry = BatchGeometry::from_accumulation(micro_batch, accumulation_steps, world_size);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", state.scalars_file, e.what()));
  }
  GA_CHECK(global_batch == saved.geometry.global_batch(),
           "{} is {}, not micro_batch x accumulation_steps x world_size = {}", piece.field_where("global_batch"),
           global_batch, saved.geometry.to_string());
  GA_CHECK(window_tokens >= 0, "{} is negative", piece.field_where("window_tokens"));
  return saved;
}

bool SavedGeometry::continues_inside_window(const BatchGeometry& current) const {
  return geometry.micro_batch() == current.micro_batch() &&
         geometry.accumulation_steps() == current.accumulation_steps() && geometry.world_size() == current.world_size();
}

void SavedGeometry::check_continues(const TrainingState& /*state*/, const BatchGeometry& current,
                                    int64_t current_window_tokens) const {
  GA_CHECK(window_tokens == current_window_tokens, "checkpoint: it was saved with window_tokens {} and this run has {}",
           window_tokens, current_window_tokens);
  GA_CHECK(window_tokens > 0 || geometry.global_batch() == current.global_batch(),
           "checkpoint: it was saved with global batch {} and this run has {}", geometry.global_batch(),
           current.global_batch());
}

// A run that trained `step` windows of at most B samples has seen at most step·B samples, and is
// in epoch step·B at the latest (every epoch holds at least one sample).
void SavedGeometry::check_position_is_possible(const TrainingState& state) const {
  const auto& p = state.position;
  const auto& what = state.scalars_file;
  // Windows measured in tokens hold any number of samples, and never span two epochs.
  if (window_tokens > 0) {
    GA_CHECK(p.epoch <= p.step, "{}: epoch {} is impossible after {} windows", what, p.epoch, p.step);
    return;
  }
  // step + 1 windows: the samples of an interrupted window may be counted with the ones before.
  const int64_t global_batch = geometry.global_batch();
  int64_t windows = 0, most = 0;
  if (__builtin_add_overflow(p.step, 1, &windows) || __builtin_mul_overflow(windows, global_batch, &most)) return;
  GA_CHECK(p.samples <= most, "{}: samples {} is more than {} windows of {} samples hold", what, p.samples, windows,
           global_batch);
  GA_CHECK(p.epoch <= most, "{}: epoch {} is impossible after {} windows of {} samples", what, p.epoch, p.step,
           global_batch);
}

}  // namespace gradaccum::core
