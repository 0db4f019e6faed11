// Optimizer state saved in one layout, loaded into another: a checkpoint of W ranks under ZeRO-1/2
// resumed at another world size or without sharding, or a whole state resumed under ZeRO.
//
// The saved parts name their tensors as named_optimizer_state() does: "<param>.<field>" for a
// whole parameter, "<param>[begin:end].<field>" for a range of its flattened elements (a
// ShardedOptimizer's shard). The parts are joined into each parameter's whole state, every
// element covered exactly once, then cut as the optimizer being loaded holds it. The optimizers
// are element-wise, so the state of an element does not depend on which rank stepped it, and the
// resumed run follows the uninterrupted one as another decomposition of its batch does.
//
// Joining holds each parameter's whole state on every rank while it loads, once: the cost of
// changing the layout (a resume in the same layout reads its own shard only).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "gradaccum/optim/optimizer_state.h"

namespace gradaccum::dist {

// Each parameter's whole state from `parts` (any number of saved files, in any order), named
// "<param>.<field>" in the parameter's shape. `what` names the checkpoint in the one-line
// gradaccum::Error for a tensor of no parameter, a bad range, parts that disagree on a step, or
// a field whose parts leave elements uncovered or cover one twice.
optim::NamedStateTensors join_optimizer_state(const std::vector<optim::NamedStateTensors>& parts,
                                              const optim::NamedParameters& params, const std::string& what);

// Loads `parts` (a checkpoint's optimizer files, saved in another layout) into `optimizer`, a
// ShardedOptimizer (which takes its ranges of the joined state) or any other optimizer over
// `params` (which takes it whole).
void load_resharded_optimizer_state(torch::optim::Optimizer& optimizer, const optim::NamedParameters& params,
                                    const std::vector<optim::NamedStateTensors>& parts, const std::string& what);

}  // namespace gradaccum::dist
