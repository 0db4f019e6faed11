// Activation (gradient) checkpointing: trade compute for memory by keeping
// none of a function's intermediate activations in the forward and recomputing
// them in the backward.
//
// libtorch 1.13's C++ API has no torch.utils.checkpoint, so this is our own,
// in the reentrant style of torch.utils.checkpoint(use_reentrant=True): a
// custom autograd Function whose forward runs `fn` without grad and saves only
// its inputs, and whose backward re-runs `fn` with grad on detached copies of
// the inputs and back-propagates the incoming gradient through that fresh
// graph. Parameters used inside `fn` therefore receive their .grad from the
// inner backward exactly as in a plain backward (same operations, same order;
// tensor hooks on them fire there), and the inputs' gradients flow on to the
// rest of the graph.
//
// The recompute reproduces the forward: it runs under the autocast state
// (CPU and CUDA enabled flags and dtypes) captured at forward time, and with
// the default CPU generator (and the CUDA one of the first CUDA input) reset to
// its forward-time state, so random ops such as dropout draw the same masks.
// The generators are restored afterwards: the backward does not move the
// global random streams. Under autocast the forward caches no weight casts
// (made without grad, they would cut a weight off the recompute's graph) and
// the casts cached by the recompute are dropped after it (they hold this
// step's weight values).
//
// Limits: `fn` returns one tensor and must be a pure function of its inputs,
// the parameters it captures and the random state (no side effects that must
// not happen twice). Like PyTorch's reentrant variant, the checkpointed output
// is differentiated with torch::autograd::backward, not autograd::grad: a
// caller asking for torch::autograd::grad(outputs, {some input}) still gets its
// answer, but parameters inside fn accumulate .grad as a side effect.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace gradaccum::models {

using CheckpointFn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

// fn(inputs), checkpointed when it matters: when grad mode is on and some
// input or some tensor of `parameters` requires grad. Otherwise (no-grad,
// inference, nothing trainable) it simply returns fn(inputs), calling fn once.
//
// `inputs`: the tensors fn reads that come from outside it (activations,
// masks); all must be defined. Floating inputs that require grad get their
// gradient; others (a bool attention mask, a constant ALiBi bias) pass through
// with none. `parameters`: the trainable tensors fn captures (e.g. a module's
// parameters()). They are not differentiated through the custom Function —
// the inner backward accumulates their .grad — but they decide whether
// checkpointing is needed, and make it work when no input requires grad
// (frozen embeddings before trainable blocks), where a purely reentrant
// checkpoint would silently drop their gradients.
//
// Throws gradaccum::Error when an input is undefined or fn returns an
// undefined tensor.
torch::Tensor checkpoint(const CheckpointFn& fn, const std::vector<torch::Tensor>& inputs,
                         const std::vector<torch::Tensor>& parameters = {});

}  // namespace gradaccum::models
