// Where a run is, in the terms a resumed run needs: the loop's position in the data and the step
// count, and every piece's own state (piece_state.h) under the piece's name: the geometry the
// Trainer ran with, the fp16 loss scale, the OOM recovery's micro-batch, and — when a run was
// preempted inside a window — the partially accumulated window itself. Model weights and
// optimizer state are not here: they belong to the model and the optimizer, which save
// themselves.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "gradaccum/core/piece_state.h"

namespace gradaccum::core {

struct TrainingPosition {
  int64_t step = 0;           // optimizer steps completed (windows consumed)
  int64_t schedule_step = 0;  // the LR schedule's position: step minus fp16 overflow skips
  int64_t epoch = 0;          // epoch of the next window
  int64_t window = 0;         // index of the next window within its epoch (last_window: carry: from the run's start)
  // > 0: micro-steps of that window already accumulated (on this rank: ranks may have stopped
  // after different micro-steps, core/stop_agreement.h; a checkpoint records rank 0's here).
  int64_t micro_step = 0;
  // Running figures for the summary of a run that spans several processes.
  double loss_total = 0.0;  // Σ window losses
  int64_t samples = 0;
  int64_t items = 0;
};

struct TrainingState {
  TrainingPosition position;
  std::map<std::string, PieceState> pieces;  // by the piece's name

  // Where a state read back from a checkpoint came from (io sets them), for the pieces' messages:
  // the file of the pieces' scalars, and the one of this rank's tensors.
  std::string scalars_file = "checkpoint";
  std::string tensors_file = "checkpoint";

  // Piece `name`'s entry, for its save.
  PieceState& piece(const std::string& name) { return pieces[name]; }
  // Piece `name`'s entry as saved (empty when it saved nothing), for its restore: its messages
  // name the files above.
  PieceState saved_piece(const std::string& name) const;
};

enum class SaveReason { periodic, final, preempted };

// Called by the loop when a checkpoint is due. The implementation (io/) owns the
// format; it reaches the model and the optimizer through its own references.
class CheckpointHook {
 public:
  virtual ~CheckpointHook() = default;
  virtual void save(const TrainingState& state, SaveReason reason) = 0;
};

}  // namespace gradaccum::core
