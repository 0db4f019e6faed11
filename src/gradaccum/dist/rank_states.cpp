#include "gradaccum/dist/rank_states.h"

#include <algorithm>

#include "gradaccum/base/check.h"

namespace gradaccum::dist {

namespace {
int64_t shard_of(int64_t elements, int64_t world) { return (elements + world - 1) / world; }
}  // namespace

RankStateBytes rank_state_bytes(const ModelStates& model, int64_t world, int64_t zero_stage, GradShardPolicy policy) {
  GA_CHECK(world >= 1 && zero_stage >= 0 && zero_stage <= 3, "rank states: world {} and zero stage {}", world,
           zero_stage);
  const int64_t e = model.element_bytes;
  int64_t trained = model.root_elements;
  for (const int64_t u : model.unit_elements) trained += u;
  const bool defer = policy == GradShardPolicy::defer;
  RankStateBytes bytes;
  if (world == 1) zero_stage = 0;  // nothing to shard
  if (zero_stage < 3) {
    const int64_t shard = shard_of(trained, world);
    bytes.parameters = trained * e + model.frozen_bytes;
    bytes.optimizer = model.moments * (zero_stage >= 1 ? shard : trained) * e;
    if (zero_stage < 2) {
      bytes.gradients = trained * e;
    } else {
      // defer: the whole gradient in .grad, the shard at the window's end; each_micro_step: the
      // shard, and a micro-step's whole gradient in .grad until it is reduced.
      bytes.gradients = (defer ? trained : shard) * e;
      bytes.transient = (defer ? shard : trained) * e;
    }
    return bytes;
  }
  // ZeRO-3: every unit a flat buffer of W ranges kept as this rank's range; the root whole (its
  // shard a view of it).
  int64_t shards = 0;
  std::vector<int64_t> gathered;
  for (const int64_t u : model.unit_elements) {
    shards += shard_of(u, world);
    gathered.push_back(shard_of(u, world) * world);
  }
  // Two units whole at a time at most: one computing, the next one's gather started.
  std::sort(gathered.rbegin(), gathered.rend());
  const int64_t largest = gathered.empty() ? 0 : gathered[0];
  const int64_t two_gathered = largest + (gathered.size() > 1 ? gathered[1] : 0);
  const int64_t root_shard = shard_of(model.root_elements, world);
  bytes.parameters = (shards + root_shard * world) * e + model.frozen_bytes;
  bytes.optimizer = model.moments * (shards + root_shard) * e;
  // Defer keeps every .grad until the window's last micro-step (then the shards; a unit's .grad is
  // its flat buffer, padded), each_micro_step the shards, and one unit's and the root's .grad in a
  // backward.
  bytes.gradients = (defer ? shards * world + model.root_elements : shards + root_shard) * e;
  bytes.transient = (two_gathered + (defer ? shards + root_shard : largest + model.root_elements)) * e;
  return bytes;
}

}  // namespace gradaccum::dist
