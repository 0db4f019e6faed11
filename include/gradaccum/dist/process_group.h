// Process groups from c10d: rendezvous through a TCPStore on MASTER_ADDR:PORT,
// then Gloo, or NCCL when the build has GRADACCUM_WITH_CUDA (CMake options
// GRADACCUM_WITH_CUDA or GRADACCUM_WITH_NCCL) and the training device is CUDA.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/TensorOptions.h>

#include <chrono>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "gradaccum/dist/environment.h"

namespace gradaccum::dist {

// A connected rank: its process group, and the rendezvous store (a TCPStore on
// rank 0) for small control-plane agreements that must not be collectives.
struct Connection {
  c10::intrusive_ptr<c10d::Backend> group;
  c10::intrusive_ptr<c10d::Store> store;
};

// Connects this rank; every collective of the returned group fails after
// `timeout` instead of hanging. Throws gradaccum::Error naming the address when
// the rendezvous cannot be reached in time. `device` is the training device: a
// CUDA device gets NCCL in a GRADACCUM_WITH_CUDA build (not yet run on a GPU),
// anything else Gloo.
Connection connect(const DistEnvironment& env, std::chrono::milliseconds timeout, c10::Device device);

// Where a small collective's tensors go: NCCL only reduces CUDA tensors (on the current device,
// which connect() set), Gloo takes CPU ones.
c10::TensorOptions collective_options(const c10d::Backend& group);

// Rank 0's `values` on every rank, or an error naming the first rank whose
// value differs (used to refuse mismatched configurations across ranks).
void check_same_on_all_ranks(c10d::Backend& group, int64_t value, const std::string& what);

// The least of every rank's `value` (an all-reduce with MIN); `what` names it in a failure.
int64_t min_over_ranks(c10d::Backend& group, int64_t value,
                       const std::string& what = "an all-reduce of a start-up figure");

// Waits for `work`; a failure (a peer died or stalled past dist_timeout) becomes a one-line
// gradaccum::Error naming this rank and `what` instead of Gloo's multi-line trace.
void wait_for(const c10::intrusive_ptr<c10d::Work>& work, int64_t rank, const std::string& what);

// Waits until every rank arrives (checkpoint writes use it); a dead or stalled
// peer is an error naming `what` after the group's timeout.
void barrier(c10d::Backend& group, const std::string& what);

}  // namespace gradaccum::dist
