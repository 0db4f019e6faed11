// `gradaccum plan [CONFIG] [--global-batch B] [--memory LIMIT] [--steps K] [--set key=value]... [--json]`
//
// Chooses the micro-batch b (and N = B / b) for one process of a configured run without ever
// changing the global batch B: for each b that divides B, from 1 upwards, a probe — the program
// itself in a child process, training K optimizer steps of b × B/b with the samples longest
// first (train_sampling_strategy: longest_first: the worst case for memory comes first) — reports
// its peak memory (peak RSS on the CPU; the CUDA caching allocator's peak on a GPU) and its
// samples per second (the median step after the first). The probe holds what the run will hold:
// forward and backward of a micro-batch, the accumulated gradients and the optimizer's state.
// Larger b are not probed once one does not fit. The choice is the fastest b that fits LIMIT
// (default: the memory the system has available, less 10%; an explicit LIMIT is used as given,
// with no margin, and the output says so), where probes within 5% of the
// fastest count as equally fast and the largest of them wins (fewer micro-steps per window).
// When no b fits, it says so and exits 1: B is never changed.
//
// What a probe cannot see: memory other processes take later, fragmentation over a long run,
// evaluation batches (per_device_eval_batch_size), and data parallel ranks (plan one process).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradaccum/core/batch_geometry.h"
#include "gradaccum/dist/rank_states.h"

namespace gradaccum::cli {

struct PlanArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t global_batch = 0;  // 0: the configuration's b × N
  std::string memory;        // "", or a size: 6000 (MB), 6000M, 8G, 8GiB
  int64_t steps = 3;         // optimizer steps per probe
  bool json = false;
};

struct PlanCandidate {
  core::BatchGeometry geometry;  // b × B/b × 1: one process's share
  double peak_mb = 0.0;          // 0 when the probe failed
  double samples_per_s = 0.0;
  bool fits = false;
  std::string error;  // the probe's last line of stderr when it failed
};

// One rank's share of the model's states under one zero stage and policy at one world size
// (dist/rank_states.h), for the plan's table.
struct RankStatesRow {
  int64_t zero_stage = 0;
  std::string policy;  // stages 2 and 3: each_micro_step or defer; else empty
  int64_t world_size = 1;
  dist::RankStateBytes bytes;
};

struct Plan {
  int64_t global_batch = 0;
  double limit_mb = 0.0;
  bool limit_given = false;  // --memory: the limit as given, no margin (else 90% of what is available)
  std::string memory_kind;   // "peak RSS" or "CUDA peak allocated"
  std::vector<PlanCandidate> candidates;
  std::optional<PlanCandidate> choice;
  dist::ModelStates states;                // what is trained and what is frozen (LoRA: the base)
  std::vector<RankStatesRow> rank_states;  // stages 0–3 × policies × W = 2, 4, 8
};

// Probes and chooses (the table and the choice printed unless `quiet`). Throws gradaccum::Error
// on bad arguments or configuration.
Plan make_plan(const PlanArgs& args, bool quiet = false);

// Prints the plan (a table, or JSON with --json); returns 0 with a choice, 1 without.
int run_plan(const PlanArgs& args);

// "6000" (MB), "6000M", "6000MB", "512MiB", "441066KiB", "8G", "8GB", "8GiB", "1TiB" → MB (2^20
// bytes). Throws on anything else.
double parse_memory_mb(const std::string& text);

}  // namespace gradaccum::cli
