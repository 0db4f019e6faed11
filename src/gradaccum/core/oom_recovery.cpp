#include "gradaccum/core/oom_recovery.h"

#include "gradaccum/base/check.h"

namespace gradaccum::core {

OomRecovery::OomRecovery(bool enabled, int64_t max_tokens_per_micro_batch, std::vector<torch::Tensor> params,
                         int64_t rank, int64_t world_size, torch::Device device)
    : enabled_(enabled),
      max_tokens_per_micro_batch_(max_tokens_per_micro_batch),
      params_(std::move(params)),
      rank_(rank),
      world_size_(world_size),
      device_(device) {}

void OomRecovery::begin_window(WindowState&) {
  out_of_memory_ = false;
  message_.clear();
  bytes_ = 0;
}

bool OomRecovery::absorb_micro_step_error(const std::exception& e, WindowState& w, int64_t s) {
  if (!enabled_ || !is_out_of_memory(e)) return false;
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string message = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  out_of_memory_ = true;
  message_ = fmt::format("micro-step {} of {} with micro-batch {}: {}", s, w.window.micro_steps(),
                         w.window.micro_batch(s, rank_).size(0), message.substr(0, message.find('\n')));
  bytes_ = requested_bytes(message);
  if (world_size_ == 1) {
    drop_gradients();
    throw WindowOutOfMemory(message_, bytes_);
  }
  w.gave_up = true;
  // The failed micro-step's memory back to the system before this rank takes part in the rest of
  // the window's collectives (ZeRO-3 gathers units for them).
  release_cached_memory(device_);
  return true;
}

void OomRecovery::contribute(WindowTotals& totals, WindowState&) {
  if (out_of_memory_) totals.out_of_memory_ranks.fill_(1.0);
}

// Known to every rank before anything steps: the one read this costs per window (a
// device-to-host copy of one value on a GPU), with several ranks only.
void OomRecovery::after_reduce(WindowTotals& totals, WindowState&) {
  if (!enabled_ || world_size_ == 1) return;
  if (host_value(totals.out_of_memory_ranks.to(torch::kCPU)) > 0.0) {
    drop_gradients();
    throw WindowOutOfMemory(out_of_memory_ ? message_ : "another rank ran out of memory", bytes_);
  }
}

BatchGeometry OomRecovery::shrink(const WindowOutOfMemory& oom, const BatchGeometry& from, int64_t step) {
  GA_CHECK(max_tokens_per_micro_batch_ == 0,
           "out of memory at optimizer step {} with max_tokens_per_micro_batch {}: lower it ({})", step,
           max_tokens_per_micro_batch_, oom.what());
  const auto to = smaller_micro_batch(from);
  GA_CHECK(to.has_value(), "out of memory at optimizer step {} with a micro-batch of 1 sample{}: {}", step,
           oom.bytes() > 0
               ? fmt::format(" (it asked for {:.1f} MiB more)", static_cast<double>(oom.bytes()) / (1024.0 * 1024.0))
               : std::string(),
           oom.what());
  release_cached_memory(device_);
  shrunk_ = true;
  return *to;
}

void OomRecovery::save(TrainingState& state) const {
  state.piece(kPiece).set_flag("micro_batch_from_oom_recovery", shrunk_);
}

std::optional<BatchGeometry> OomRecovery::resumed_geometry(const TrainingState& state, const BatchGeometry& saved,
                                                           const BatchGeometry& current) {
  // A state that records nothing (one a caller made) ran with the configured micro-batch.
  const auto piece = state.saved_piece(kPiece);
  if (!piece.has("micro_batch_from_oom_recovery") || !piece.flag("micro_batch_from_oom_recovery") ||
      saved.global_batch() != current.global_batch() || saved.world_size() != current.world_size() ||
      saved.micro_batch() >= current.micro_batch()) {
    return std::nullopt;
  }
  shrunk_ = true;
  return saved;
}

void OomRecovery::drop_gradients() {
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
}

}  // namespace gradaccum::core
