// What one data-parallel rank holds of a model's states (weights, gradients, optimizer state)
// under each zero stage and gradient policy, activations apart: the figures `gradaccum plan`
// prints, counted as the sharded pieces allocate them (ranges padded to W equal parts).
#pragma once

#include <cstdint>
#include <vector>

#include "gradaccum/dist/grad_shard_policy.h"

namespace gradaccum::dist {

struct ModelStates {
  std::vector<int64_t> unit_elements;  // trainable elements of each unit that holds some (ZeRO-3's)
  int64_t root_elements = 0;           // trainable elements in no unit
  int64_t element_bytes = 4;           // of a trainable element, its gradient and its moments
  int64_t frozen_bytes = 0;            // parameters not trained: whole on every rank
  int64_t moments = 2;                 // optimizer tensors per trainable element (AdamW 2, SGD with momentum 1)
};

struct RankStateBytes {
  // Held between micro-steps, by the rank that holds most (rank 0: the last range is the short one).
  int64_t parameters = 0, gradients = 0, optimizer = 0;
  // The most a micro-step holds on top: a gathered unit, one micro-step's gradients in .grad
  // before they are reduced, the gradient shards of the window's end.
  int64_t transient = 0;
  int64_t held() const { return parameters + gradients + optimizer; }
};

// `zero_stage` 0–3 at `world` ranks; `policy` (each_micro_step or defer) for stages 2 and 3.
RankStateBytes rank_state_bytes(const ModelStates& model, int64_t world, int64_t zero_stage, GradShardPolicy policy);

}  // namespace gradaccum::dist
