// The gradient of a tied embedding table, summed where it is made.
//
// A tied LM head's table gets two gradients in one backward: the fused loss's
// dense [vocab, hidden] head part (chunked_cross_entropy.h) and the token
// lookup's rows. Left to autograd, libtorch 2.x adds them out of place (a
// sparse addend never joins a dense buffer in place there): one more
// [vocab, hidden] buffer and a full copy per micro-step, 154 MB and ~80 ms for
// GPT-2 small on a 2-core CPU (BENCHMARKS.md). Paired through this object, the
// loss hands its dense gradient over instead of returning it, and the lookup's
// backward adds its rows into it in place and returns the sum as the table's
// one gradient.
//
// Whichever of the two backward nodes runs second returns the gradient, so the
// result does not depend on the engine's order (the lookup's backward always
// follows the loss's: every path from the lookup leads to the loss). One
// pairing serves one forward and one backward.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/torch.h>

#include <mutex>

namespace gradaccum::models {

class TiedTableGradient : public torch::CustomClassHolder {
 public:
  // The loss's backward: its dense gradient of the table. Returns what the loss
  // gives autograd for the table: nothing while the lookup's backward is still
  // to come (it returns the sum), the gradient itself once the lookup has run.
  torch::Tensor hand_over(torch::Tensor head_gradient);

  // The lookup's backward: `rows` [N, hidden] added at `ids` [N] into the head's
  // gradient in place (in index order, as index_add_ does), or into zeros shaped
  // like `table` when the loss handed nothing over (it did not need the table's
  // gradient, or it has not run yet and will return its own).
  torch::Tensor add_rows(const torch::Tensor& table, const torch::Tensor& ids, const torch::Tensor& rows);

 private:
  std::mutex mutex_;
  torch::Tensor head_gradient_;
  bool rows_added_ = false;
};

// The rows of `table` for `input_ids` (torch::embedding's forward), whose
// backward gives the table's gradient through `pairing`.
torch::Tensor lookup_tied_rows(const torch::Tensor& table, const torch::Tensor& input_ids,
                               const c10::intrusive_ptr<TiedTableGradient>& pairing);

}  // namespace gradaccum::models
