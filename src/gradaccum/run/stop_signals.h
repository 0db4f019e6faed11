// SIGTERM and SIGINT as a stop request: the training loop saves the window in flight and stops
// (core::Trainer::set_checkpointing). A second signal falls back to the default action, so a stuck
// run can still be interrupted.
#pragma once

#include <atomic>

namespace gradaccum::run {

// Installs the handlers (once per process; later calls do nothing more) and returns the flag they
// raise.
const std::atomic<bool>& install_stop_signals();

}  // namespace gradaccum::run
