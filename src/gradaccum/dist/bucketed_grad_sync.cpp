#include "gradaccum/dist/bucketed_grad_sync.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include "gradaccum/base/check.h"
#include "gradaccum/dist/process_group.h"

namespace gradaccum::dist {

BucketedGradSync::BucketedGradSync(c10::intrusive_ptr<c10d::Backend> group, std::vector<torch::Tensor> params,
                                   GradSyncOptions options)
    : group_(std::move(group)), params_(std::move(params)), options_(options), armed_(std::make_shared<bool>(false)) {
  GA_CHECK(options_.bucket_bytes > 0, "ddp_bucket_cap_mb must be > 0");
  // Buckets in reverse order of registration: backward produces the last
  // layers' gradients first, so the first buckets fill (and launch) first.
  bucket_of_.resize(params_.size());
  for (size_t k = params_.size(); k-- > 0;) {
    const auto& p = params_[k];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    const bool fits = !buckets_.empty() && params_[buckets_.back().params.front()].scalar_type() == p.scalar_type() &&
                      params_[buckets_.back().params.front()].device() == p.device() &&
                      buckets_.back().buffer.numel() * p.element_size() + bytes <= options_.bucket_bytes;
    if (!fits) {
      buckets_.push_back(Bucket{});
      buckets_.back().buffer = torch::empty({0}, p.options());
    }
    auto& bucket = buckets_.back();
    bucket.params.push_back(k);
    bucket.buffer = torch::empty({bucket.buffer.numel() + p.numel()}, p.options());
    bucket_of_[k] = buckets_.size() - 1;
  }
  grad_views_.resize(params_.size());
  for (auto& bucket : buckets_) {
    bucket.pending = static_cast<int64_t>(bucket.params.size());
    int64_t offset = 0;
    for (auto k : bucket.params) {
      const auto n = params_[k].numel();
      grad_views_[k] = bucket.buffer.slice(0, offset, offset + n).view_as(params_[k]);
      offset += n;
    }
  }

  // Same starting weights everywhere (the ranks' seeds already agree; this
  // also covers models initialized differently per rank).
  {
    torch::NoGradGuard no_grad;
    for (auto& bucket : buckets_) {
      std::vector<torch::Tensor> flat;
      for (auto k : bucket.params) flat.push_back(params_[k].detach().reshape(-1));
      std::vector<torch::Tensor> buffer{torch::cat(flat)};
      c10d::BroadcastOptions broadcast;
      broadcast.rootRank = 0;
      wait_for(group_->broadcast(buffer, broadcast), rank(), "the initial parameter broadcast");
      int64_t offset = 0;
      for (auto k : bucket.params) {
        auto& p = params_[k];
        p.detach().copy_(buffer[0].slice(0, offset, offset + p.numel()).view_as(p));
        offset += p.numel();
      }
    }
  }

  // A post-hook on each gradient accumulator runs after .grad was updated.
  for (size_t k = 0; k < params_.size(); ++k) {
    auto accumulator = torch::autograd::impl::grad_accumulator(params_[k]);
    std::weak_ptr<bool> armed = armed_;
    accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, k, armed](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          auto flag = armed.lock();
          if (flag && *flag) on_gradient_ready(k);
          return outputs;
        }));
    accumulators_.push_back(std::move(accumulator));
  }
}

BucketedGradSync::~BucketedGradSync() {
  *armed_ = false;  // the hooks outlive us inside the autograd graph's nodes
  for (auto& bucket : buckets_) {
    try {
      if (bucket.work) bucket.work->wait();
    } catch (const std::exception&) {  // already reported by the failing call
    }
  }
}

bool BucketedGradSync::grad_is_view(size_t k) const {
  const auto& g = params_[k].grad();
  return g.defined() && g.data_ptr() == grad_views_[k].data_ptr() && g.sizes() == grad_views_[k].sizes();
}

void BucketedGradSync::adopt_gradient(size_t k) {
  if (grad_is_view(k)) return;
  torch::NoGradGuard no_grad;
  auto& p = params_[k];
  if (p.grad().defined()) {
    grad_views_[k].copy_(p.grad());
  } else {
    grad_views_[k].zero_();  // released by the step sequence, or an unused parameter
  }
  p.mutable_grad() = grad_views_[k];
}

void BucketedGradSync::before_backward(bool last) {
  for (size_t k = 0; k < params_.size(); ++k) adopt_gradient(k);
  *armed_ = last || options_.sync_each_micro_step;
}

void BucketedGradSync::on_gradient_ready(size_t param) {
  auto& bucket = buckets_[bucket_of_[param]];
  if (--bucket.pending == 0) launch_ready_buckets(false);
}

void BucketedGradSync::launch_ready_buckets(bool force) {
  while (next_launch_ < buckets_.size() && (force || buckets_[next_launch_].pending <= 0)) {
    auto& bucket = buckets_[next_launch_];
    // Normally a no-op (before_backward adopted every .grad); covers a .grad
    // replaced during backward.
    for (auto k : bucket.params) adopt_gradient(k);
    std::vector<torch::Tensor> tensors{bucket.buffer};
    bucket.work = group_->allreduce(tensors);  // sum
    ++window_calls_;
    window_bytes_ += bucket.buffer.numel() * static_cast<int64_t>(bucket.buffer.element_size());
    ++next_launch_;
  }
}

void BucketedGradSync::complete_round(double scale) {
  launch_ready_buckets(/*force=*/true);
  for (auto& bucket : buckets_) {
    wait_for(bucket.work, rank(), "a gradient all-reduce");
    bucket.work.reset();
    if (scale != 1.0) bucket.buffer.mul_(scale);
    bucket.pending = static_cast<int64_t>(bucket.params.size());
  }
  next_launch_ = 0;
  *armed_ = false;
}

void BucketedGradSync::after_backward(bool last) {
  // Syncing every micro-step (comparison mode): average now, so that the next
  // micro-step adds its local gradient to a value every rank shares.
  if (options_.sync_each_micro_step) complete_round(1.0 / static_cast<double>(world_size()));
}

void BucketedGradSync::finish_window(torch::Tensor& totals) {
  if (options_.sync_each_micro_step) {
    // The gradients hold the rank average; the normalizer expects the sum.
    const double w = static_cast<double>(world_size());
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad().mul_(w);
    }
  } else {
    complete_round(1.0);
  }
  std::vector<torch::Tensor> tensors{totals};
  wait_for(group_->allreduce(tensors), rank(), "the loss-total all-reduce");
  calls_ = window_calls_;
  bytes_ = window_bytes_;
  window_calls_ = 0;
  window_bytes_ = 0;
}

}  // namespace gradaccum::dist
