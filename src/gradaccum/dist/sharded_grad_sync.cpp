#include "gradaccum/dist/sharded_grad_sync.h"

#include <algorithm>
#include <set>

#include "gradaccum/base/check.h"
#include "gradaccum/dist/process_group.h"

namespace gradaccum::dist {

const base::EnumNames<GradShardPolicy>& grad_shard_policy_names() {
  static const base::EnumNames<GradShardPolicy> names{{GradShardPolicy::each_micro_step, "each_micro_step"},
                                                      {GradShardPolicy::defer, "defer"},
                                                      {GradShardPolicy::automatic, "auto"}};
  return names;
}

GradShardChoice choose_grad_shard_policy(int64_t gradient_bytes, int64_t shard_bytes, int64_t available_bytes) {
  constexpr double kMiB = 1024.0 * 1024.0;
  const int64_t extra = gradient_bytes - shard_bytes;
  if (available_bytes <= 0) {
    return {GradShardPolicy::each_micro_step,
            fmt::format("each_micro_step: the memory available is unknown, and deferring would hold {:.1f} MiB "
                        "more gradient between micro-steps",
                        static_cast<double>(extra) / kMiB)};
  }
  const bool fits = extra <= available_bytes / 2;
  return {fits ? GradShardPolicy::defer : GradShardPolicy::each_micro_step,
          fmt::format("{}: deferring holds the whole gradient between micro-steps, {:.1f} MiB more than the shard, "
                      "{} half of the {:.1f} MiB available (the other half left to a micro-batch's activations)",
                      fits ? "defer" : "each_micro_step", static_cast<double>(extra) / kMiB,
                      fits ? "within" : "more than", static_cast<double>(available_bytes) / kMiB)};
}

UnitGradShardChoice choose_unit_grad_shard_policies(const std::vector<int64_t>& gradient_bytes,
                                                    const std::vector<int64_t>& shard_bytes, int64_t available_bytes) {
  constexpr double kMiB = 1024.0 * 1024.0;
  const size_t units = gradient_bytes.size();
  UnitGradShardChoice choice{std::vector<GradShardPolicy>(units, GradShardPolicy::each_micro_step), {}};
  std::vector<size_t> by_size(units);
  for (size_t u = 0; u < units; ++u) by_size[u] = u;
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](size_t a, size_t b) { return gradient_bytes[a] < gradient_bytes[b]; });
  const int64_t budget = std::max<int64_t>(0, available_bytes) / 2;
  int64_t held = 0;
  size_t deferred = 0;
  for (const size_t u : by_size) {
    const int64_t extra = gradient_bytes[u] - shard_bytes[u];
    if (available_bytes <= 0 || held + extra > budget) break;
    held += extra;
    choice.policies[u] = GradShardPolicy::defer;
    ++deferred;
  }
  choice.reason =
      available_bytes <= 0
          ? fmt::format("each_micro_step for all {} units: the memory available is unknown", units)
          : fmt::format(
                "defer for {} of {} units (the smallest first; {:.1f} MiB more gradient held between "
                "micro-steps, within half of the {:.1f} MiB available), each_micro_step for {}",
                deferred, units, static_cast<double>(held) / kMiB, static_cast<double>(available_bytes) / kMiB,
                units - deferred == 0 ? std::string("none") : fmt::format("the other {}", units - deferred));
  return choice;
}

ShardedGradSync::ShardedGradSync(c10::intrusive_ptr<c10d::Backend> group, std::vector<torch::Tensor> params,
                                 ShardedGradSyncOptions options)
    : group_(std::move(group)), params_(std::move(params)), options_(options) {
  GA_CHECK(options_.policy != GradShardPolicy::automatic, "the sharded gradient sync needs a policy, not auto");
  GA_CHECK(options_.bucket_bytes > 0, "ddp_bucket_cap_mb must be > 0");
  GA_CHECK(!params_.empty(), "zero_stage: 2 needs parameters to shard");
  int64_t total = 0;
  for (const auto& p : params_) {
    GA_CHECK(p.scalar_type() == params_.front().scalar_type() && p.device() == params_.front().device(),
             "zero_stage: 2 needs all parameters in one dtype and on one device");
    offsets_.push_back(total);
    total += p.numel();
  }
  offsets_.push_back(total);
  const int64_t world = world_size();
  shard_size_ = (total + world - 1) / world;
  begin_ = std::min(total, shard_size_ * rank());
  end_ = std::min(total, begin_ + shard_size_);
  const int64_t element = static_cast<int64_t>(params_.front().element_size());
  chunk_ = std::clamp<int64_t>(options_.bucket_bytes / (world * element), 1, std::max<int64_t>(1, shard_size_));

  // Same starting weights everywhere; once per run, one broadcast per parameter.
  torch::NoGradGuard no_grad;
  for (auto& p : params_) {
    std::vector<torch::Tensor> buffer{p.detach().contiguous()};
    c10d::BroadcastOptions broadcast;
    broadcast.rootRank = 0;
    wait_for(group_->broadcast(buffer, broadcast), rank(), "the initial parameter broadcast");
    if (!buffer[0].is_same(p)) p.detach().copy_(buffer[0]);
  }
}

void ShardedGradSync::before_backward(bool) {
  if (in_window_) return;
  // A new window: the last one's summed shard was stepped from; its memory goes back first.
  in_window_ = true;
  shard_ = torch::Tensor();
  window_calls_ = 0;
  window_bytes_ = 0;
}

void ShardedGradSync::after_backward(bool) {
  if (options_.policy == GradShardPolicy::each_micro_step) reduce_into_shard();
}

void ShardedGradSync::finish_window(torch::Tensor& totals) {
  // defer's one reduction; each_micro_step's have all run (a window always has a micro-step,
  // but a shard is owed to the optimizer in any case).
  if (options_.policy == GradShardPolicy::defer || !shard_.defined()) reduce_into_shard();
  std::vector<torch::Tensor> tensors{totals};
  wait_for(group_->allreduce(tensors), rank(), "the loss-total all-reduce");
  in_window_ = false;
  calls_ = window_calls_;
  bytes_ = window_bytes_;
}

void ShardedGradSync::stage(torch::Tensor piece, int64_t lo, int64_t hi) const {
  piece.zero_();
  // The first parameter ending after lo.
  size_t k = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), lo) - offsets_.begin()) - 1;
  for (; k < params_.size() && offsets_[k] < hi; ++k) {
    const auto& g = params_[k].grad();
    if (!g.defined()) continue;
    const int64_t a = std::max(lo, offsets_[k]), b = std::min(hi, offsets_[k + 1]);
    piece.slice(0, a - lo, b - lo).copy_(g.reshape({-1}).slice(0, a - offsets_[k], b - offsets_[k]));
  }
}

void ShardedGradSync::reduce_into_shard() {
  torch::NoGradGuard no_grad;
  const auto options = params_.front().options().requires_grad(false);
  if (!shard_.defined()) shard_ = torch::zeros({shard_size_}, options);
  const int64_t world = world_size();
  auto staging = torch::empty({world * chunk_}, options);
  auto received = torch::empty({chunk_}, options);
  for (int64_t c0 = 0; c0 < shard_size_; c0 += chunk_) {
    const int64_t n = std::min(shard_size_, c0 + chunk_) - c0;
    auto input = staging.slice(0, 0, world * n);
    for (int64_t r = 0; r < world; ++r)
      stage(input.slice(0, r * n, (r + 1) * n), r * shard_size_ + c0, r * shard_size_ + c0 + n);
    auto output = received.slice(0, 0, n);
    wait_for(group_->reduce_scatter_single(output, input), rank(), "a gradient reduce-scatter");
    shard_.slice(0, c0, c0 + n).add_(output);
    ++window_calls_;
    window_bytes_ += input.numel() * static_cast<int64_t>(input.element_size());
  }
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
}

std::vector<torch::Tensor> ShardedGradSync::gradients(const std::vector<torch::Tensor>&) const {
  if (!shard_.defined()) return {};
  return {gradient_shard()};
}

torch::Tensor ShardedGradSync::gradient_shard() const {
  GA_CHECK(shard_.defined(), "the sharded gradient is read outside an optimizer step");
  return shard_.slice(0, 0, end_ - begin_);
}

torch::Tensor ShardedGradSync::global_norm(const std::vector<torch::Tensor>& gradients) {
  // The shards are disjoint: their squared norms add up to the whole gradient's.
  const auto device = params_.front().device();
  std::vector<torch::Tensor> squares{optim::tensors_norm(gradients).to(device).square().reshape({1})};
  wait_for(group_->allreduce(squares), rank(), "the gradient-norm all-reduce");
  return squares[0].sqrt().reshape({});
}

int64_t ShardedGradSync::held_gradient_bytes() const {
  std::set<const void*> storages;
  int64_t bytes = 0;
  auto count = [&](const torch::Tensor& t) {
    if (t.defined() && storages.insert(t.storage().data()).second) bytes += static_cast<int64_t>(t.storage().nbytes());
  };
  for (const auto& p : params_) count(p.grad());
  count(shard_);
  return bytes;
}

}  // namespace gradaccum::dist
