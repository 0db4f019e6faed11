#include "gradaccum/dist/tree_grad_sync.h"

#include "gradaccum/base/check.h"
#include "gradaccum/dist/process_group.h"

namespace gradaccum::dist {

TreeGradSync::TreeGradSync(c10::intrusive_ptr<c10d::Backend> group, std::vector<torch::Tensor> params)
    : group_(std::move(group)), params_(std::move(params)) {
  const int64_t world = world_size();
  GA_CHECK(world >= 1 && (world & (world - 1)) == 0,
           "deterministic_accumulation: the world size must be a power of two, not {}", world);
  GA_CHECK(!params_.empty(), "deterministic_accumulation: the model has no trainable parameters");
  for (const auto& p : params_) {
    GA_CHECK(p.scalar_type() == params_.front().scalar_type() && p.device() == params_.front().device(),
             "deterministic_accumulation: the parameters have more than one dtype or device");
  }
  for (auto& p : params_) {
    std::vector<torch::Tensor> tensor{p.detach()};
    c10d::BroadcastOptions options;
    options.rootRank = 0;
    wait_for(group_->broadcast(tensor, options), rank(), "the initial parameter broadcast");
  }
}

void TreeGradSync::exchange(torch::Tensor& mine, torch::Tensor& theirs, int partner, int tag, const char* what) {
  std::vector<torch::Tensor> out{mine}, in{theirs};
  const auto message = fmt::format("the exchange of {} with rank {}", what, partner);
  if (rank() < partner) {
    wait_for(group_->send(out, partner, tag), rank(), message);
    wait_for(group_->recv(in, partner, tag), rank(), message);
  } else {
    wait_for(group_->recv(in, partner, tag), rank(), message);
    wait_for(group_->send(out, partner, tag), rank(), message);
  }
  bytes_ += mine.numel() * static_cast<int64_t>(mine.element_size());
  ++calls_;
}

void TreeGradSync::finish_window(torch::Tensor& totals) {
  calls_ = bytes_ = 0;
  // One flat buffer of this rank's gradients, and which of them it has.
  const auto& like = params_.front();
  std::vector<torch::Tensor> flat;
  std::vector<int64_t> offsets{0};
  auto present = torch::zeros({static_cast<int64_t>(params_.size())},
                              torch::TensorOptions(torch::kDouble).device(totals.device()));
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& g = params_[i].grad();
    flat.push_back(g.defined() ? g.reshape(-1) : torch::zeros({params_[i].numel()}, like.options()));
    if (g.defined()) present[static_cast<int64_t>(i)] = 1.0;
    offsets.push_back(offsets.back() + params_[i].numel());
  }
  auto gradients = torch::cat(flat);
  flat.clear();
  auto small = torch::cat({totals.to(torch::kDouble), present});
  auto their_gradients = torch::empty_like(gradients);
  auto their_small = torch::empty_like(small);
  const auto n = totals.numel();
  for (int distance = 1; distance < world_size(); distance *= 2) {
    const int partner = static_cast<int>(rank()) ^ distance;
    exchange(small, their_small, partner, 2 * distance, "the window's totals");
    exchange(gradients, their_gradients, partner, 2 * distance + 1, "the gradients");
    // Per parameter: both present, the sum; one present, that one (on the device, no host read).
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto a = small[n + static_cast<int64_t>(i)] > 0.0;
      const auto b = their_small[n + static_cast<int64_t>(i)] > 0.0;
      auto part = gradients.narrow(0, offsets[i], offsets[i + 1] - offsets[i]);
      const auto other = their_gradients.narrow(0, offsets[i], offsets[i + 1] - offsets[i]);
      part.copy_(torch::where(a.logical_and(b), part + other, torch::where(b, other, part)));
    }
    // Totals are sums (the loss's own is redone in tree order afterwards); flags are "either".
    small.narrow(0, 0, n).add_(their_small.narrow(0, 0, n));
    small.narrow(0, n, present.numel())
        .copy_(torch::maximum(small.narrow(0, n, present.numel()), their_small.narrow(0, n, present.numel())));
  }
  totals.copy_(small.narrow(0, 0, n));
  // Which parameters any rank had a gradient for: one small read per window, so that a parameter
  // no rank trained stays without a gradient (and untouched by the optimizer) as in one process.
  const auto flags = small.narrow(0, n, present.numel()).to(torch::kCPU);
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    if (flags[static_cast<int64_t>(i)].item<double>() > 0.0) {
      p.mutable_grad() = gradients.narrow(0, offsets[i], offsets[i + 1] - offsets[i]).view_as(p);
    } else {
      p.mutable_grad() = torch::Tensor();
    }
  }
}

}  // namespace gradaccum::dist
