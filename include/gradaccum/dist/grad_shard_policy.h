// How ZeRO-2 brings a window's micro-step gradients into each rank's shard (sharded_grad_sync),
// and the memory rule by which `auto` chooses. No libtorch here: the configuration's key table
// reads these names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gradaccum/base/enum_names.h"

namespace gradaccum::dist {

// each_micro_step: every micro-step's gradient is reduce-scattered into the shard and released
// (N collectives a window; a rank holds 1/W of the gradient between micro-steps).
// defer: the whole gradient accumulates locally and is reduce-scattered once, on the window's
// last micro-step (one collective; a rank holds the whole gradient between micro-steps).
// automatic ("auto"): one of the two, by choose_grad_shard_policy().
enum class GradShardPolicy { each_micro_step, defer, automatic };

const base::EnumNames<GradShardPolicy>& grad_shard_policy_names();  // "each_micro_step" | "defer" | "auto"

struct GradShardChoice {
  GradShardPolicy policy;  // each_micro_step or defer
  std::string reason;      // one line for the log
};

// auto's rule. Between micro-steps, defer holds `gradient_bytes` (the whole gradient) where
// each_micro_step holds `shard_bytes`; the difference has to sit beside the next micro-step's
// activations, which are not measured at start-up (`gradaccum plan` measures them). So: defer
// when that difference is at most half of `available_bytes` (the least memory any rank has
// available at start-up), leaving the other half to the activations; each_micro_step otherwise,
// and when the available memory is unknown (0).
GradShardChoice choose_grad_shard_policy(int64_t gradient_bytes, int64_t shard_bytes, int64_t available_bytes);

struct UnitGradShardChoice {
  std::vector<GradShardPolicy> policies;  // per unit: each_micro_step or defer
  std::string reason;                     // one line for the log
};

// auto's rule per unit (ZeRO-3), on the same budget: half of `available_bytes` for what deferring
// holds more than the shards. Deferring a unit saves N − 1 collectives whatever its size and
// costs its gradient less its shard, so the smallest units are deferred first, as many as the
// budget holds; the others reduce every micro-step. All each_micro_step when the available memory
// is unknown (0). `gradient_bytes[u]` and `shard_bytes[u]` are unit u's.
UnitGradShardChoice choose_unit_grad_shard_policies(const std::vector<int64_t>& gradient_bytes,
                                                    const std::vector<int64_t>& shard_bytes, int64_t available_bytes);

}  // namespace gradaccum::dist
