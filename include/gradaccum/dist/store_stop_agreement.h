// The stop agreement of several ranks, kept in the c10d store of the rendezvous.
//
// Per window one key, set once by compare-and-set ("first writer wins"): a rank
// asked to stop writes "stop", a rank about to enter the window's last
// micro-step writes "go", and whichever came first is every rank's answer. A
// rank that is neither polls the key at most once per `poll_interval`, so a
// stop reaches ranks that were not signalled themselves within about that time
// plus one micro-step (torchrun and `--nproc` signal every rank anyway).
// Cost: one store round trip per rank per window, none on the gradients' path;
// the gradient all-reduce still happens only on the window's last micro-step.
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "gradaccum/core/stop_agreement.h"

namespace gradaccum::dist {

class StoreStopAgreement final : public core::StopAgreement {
 public:
  StoreStopAgreement(c10::intrusive_ptr<c10d::Store> store, int64_t rank,
                     std::chrono::milliseconds poll_interval = std::chrono::seconds(1));

  bool stop_here(int64_t window, bool requested, bool entering_last) override;
  // Rank 0 deletes the window's key: every rank has read it before the
  // all-reduce that ended the window could complete.
  void window_finished(int64_t window) override;

 private:
  enum class Decision { open, go, stop };
  std::string key(int64_t window) const;
  // Runs a store operation; a lost store (rank 0 gone) is a one-line error.
  template <typename F>
  auto guarded(F&& op, const char* what);

  c10::intrusive_ptr<c10d::Store> store_;
  int64_t rank_;
  std::chrono::milliseconds poll_interval_;
  int64_t window_ = -1;
  Decision decision_ = Decision::open;
  std::chrono::steady_clock::time_point last_poll_;
};

}  // namespace gradaccum::dist
