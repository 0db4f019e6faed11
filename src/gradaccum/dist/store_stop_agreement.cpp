#include "gradaccum/dist/store_stop_agreement.h"

#include <utility>
#include <vector>

#include "gradaccum/base/check.h"

namespace gradaccum::dist {

namespace {
const std::vector<uint8_t> kStop{'s', 't', 'o', 'p'};
const std::vector<uint8_t> kGo{'g', 'o'};
}  // namespace

StoreStopAgreement::StoreStopAgreement(c10::intrusive_ptr<c10d::Store> store, int64_t rank,
                                       std::chrono::milliseconds poll_interval)
    : store_(std::move(store)), rank_(rank), poll_interval_(poll_interval) {}

std::string StoreStopAgreement::key(int64_t window) const { return "gradaccum/stop/" + std::to_string(window); }

template <typename F>
auto StoreStopAgreement::guarded(F&& op, const char* what) {
  try {
    return op();
  } catch (const std::exception& e) {
    const std::string message = e.what();
    throw Error(
        fmt::format("rank {}: {} failed (the store lives on rank 0), a peer rank died or "
                    "stalled past dist_timeout: {}",
                    rank_, what, message.substr(0, message.find('\n'))));
  }
}

bool StoreStopAgreement::stop_here(int64_t window, bool requested, bool entering_last) {
  const auto now = std::chrono::steady_clock::now();
  if (window != window_) {
    window_ = window;
    decision_ = Decision::open;
    last_poll_ = now;
  }
  if (decision_ != Decision::open) return decision_ == Decision::stop;
  const auto k = key(window);
  if (requested || entering_last) {
    // Sets the key when nobody has, and returns the value that won either way.
    const auto winner =
        guarded([&] { return store_->compareSet(k, {}, requested ? kStop : kGo); }, "the stop agreement");
    decision_ = winner == kStop ? Decision::stop : Decision::go;
  } else if (now - last_poll_ >= poll_interval_) {
    last_poll_ = now;
    if (guarded([&] { return store_->check({k}); }, "the stop agreement")) {
      const auto value = guarded([&] { return store_->get(k); }, "the stop agreement");
      decision_ = value == kStop ? Decision::stop : Decision::go;
    }
  }
  return decision_ == Decision::stop;
}

void StoreStopAgreement::window_finished(int64_t window) {
  if (rank_ == 0) guarded([&] { return store_->deleteKey(key(window)); }, "the stop agreement");
}

}  // namespace gradaccum::dist
