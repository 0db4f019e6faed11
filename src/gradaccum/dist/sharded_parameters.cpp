#include "gradaccum/dist/sharded_parameters.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "gradaccum/base/check.h"
#include "gradaccum/dist/process_group.h"

namespace gradaccum::dist {

namespace {

// On the CPU a unit's memory is mapped from the kernel and unmapped when the unit is released:
// it goes back to the system at once. From the heap (which this project's process set-up keeps,
// heap_retention.h), the buffers of a few tens of MB freed and allocated around the other
// allocations of every micro-step left the peak RSS of a rank above stage 0's.
struct Mapping {
  void* data;
  size_t bytes;
};

void unmap(void* context) {
  auto* mapping = static_cast<Mapping*>(context);
  munmap(mapping->data, mapping->bytes);
  delete mapping;
}

at::DataPtr allocate(c10::StorageImpl* storage, size_t bytes) {
  if (!storage->device().is_cpu()) return storage->allocator()->allocate(bytes);
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    const int error = errno;
    // Out of memory as libtorch's allocators say it, so that oom_recovery takes it as theirs.
    TORCH_CHECK_WITH(OutOfMemoryError, error != ENOMEM, "zero_stage: 3: cannot allocate ", bytes,
                     " bytes for a unit: ", std::strerror(error));
    throw Error(fmt::format("zero_stage: 3: cannot map {} bytes for a unit: {}", bytes, std::strerror(error)));
  }
  return at::DataPtr(data, new Mapping{data, bytes}, &unmap, storage->device());
}

// Gives `buffer`'s storage `bytes` bytes of new memory (contents undefined), or none. Its views,
// and the references autograd saved to them, stay attached to the same storage.
void set_storage_bytes(const torch::Tensor& buffer, size_t bytes) {
  auto* storage = buffer.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == bytes) return;
  storage->set_data_ptr_noswap(bytes > 0 ? allocate(storage, bytes) : at::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(bytes);
}

size_t buffer_bytes(const ShardedParameters::FlatUnit& unit, int64_t world) {
  return static_cast<size_t>(unit.shard_size * world) * unit.buffer.element_size();
}

}  // namespace

// The autograd node that brackets a unit's backward. The unit's output passes through one (a
// unit's end): its backward, the first of the unit's, gathers the parameters. The input passes
// through another (its start): its backward runs once the gradient has crossed the whole unit
// (every node of the unit lies between the two, and the parameters' AccumulateGrad nodes run
// first: the engine runs them as soon as they are ready), and ends the unit's backward.
struct UnitBoundaryNode : torch::autograd::Function<UnitBoundaryNode> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, ShardedParameters* owner,
                               int64_t unit, bool unit_start) {
    ctx->saved_data["owner"] = reinterpret_cast<int64_t>(owner);
    ctx->saved_data["unit"] = unit;
    ctx->saved_data["start"] = unit_start;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* owner = reinterpret_cast<ShardedParameters*>(ctx->saved_data["owner"].toInt());
    const auto unit = static_cast<size_t>(ctx->saved_data["unit"].toInt());
    if (ctx->saved_data["start"].toBool()) {
      owner->finish_unit_backward(owner->units_[unit]);
    } else {
      owner->gather_for_backward(unit);
    }
    return {grads[0], torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

ShardedParameters::ShardedParameters(c10::intrusive_ptr<c10d::Backend> group, std::vector<torch::Tensor> params,
                                     const core::ParameterUnits& units, ShardedGradSyncOptions options)
    : group_(std::move(group)), params_(std::move(params)), options_(options) {
  GA_CHECK(options_.bucket_bytes > 0, "ddp_bucket_cap_mb must be > 0");
  GA_CHECK(!params_.empty(), "zero_stage: 3 needs parameters to shard");
  std::map<const void*, size_t> index;
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto& p = params_[k];
    GA_CHECK(p.scalar_type() == params_.front().scalar_type() && p.device() == params_.front().device(),
             "zero_stage: 3 needs all trainable parameters in one dtype and on one device");
    index.emplace(p.unsafeGetTensorImpl(), k);
  }
  std::vector<int64_t> owner(params_.size(), -1);
  for (size_t u = 0; u < units.size(); ++u) {
    FlatUnit unit;
    for (const auto& p : units[u]) {
      const auto found = index.find(p.unsafeGetTensorImpl());
      GA_CHECK(found != index.end(), "zero_stage: 3: unit {} of the model holds a parameter that is not trainable", u);
      GA_CHECK(owner[found->second] < 0, "zero_stage: 3: a parameter belongs to units {} and {} of the model",
               owner[found->second], u);
      owner[found->second] = static_cast<int64_t>(u);
      unit.params.push_back(found->second);
    }
    unit_of_model_unit_.push_back(unit.params.empty() ? -1 : static_cast<int64_t>(units_.size()));
    if (!unit.params.empty()) units_.push_back(std::move(unit));
  }
  GA_CHECK(!units_.empty(),
           "zero_stage: 3 needs a model that declares its units (a decoder's blocks, a network's layers); "
           "this model declares none that hold a trainable parameter");
  FlatUnit root;
  root.root = true;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (owner[k] < 0) root.params.push_back(k);
  }
  unit_count_ = units_.size();
  if (!root.params.empty()) units_.push_back(std::move(root));

  // Each unit's buffer holds the parameters' values (rank 0's, one broadcast per unit) and
  // becomes their storage; this rank keeps its range as its shard.
  torch::NoGradGuard no_grad;
  const int64_t world = world_size();
  const auto tensor_options = params_.front().options().requires_grad(false);
  for (auto& unit : units_) {
    int64_t total = 0;
    for (const size_t k : unit.params) {
      unit.offsets.push_back(total);
      total += params_[k].numel();
    }
    unit.offsets.push_back(total);
    unit.shard_size = (total + world - 1) / world;
    unit.buffer = torch::zeros({unit.shard_size * world}, tensor_options);
    for (size_t i = 0; i < unit.params.size(); ++i) {
      unit.buffer.slice(0, unit.offsets[i], unit.offsets[i + 1]).copy_(params_[unit.params[i]].detach().reshape({-1}));
    }
    std::vector<torch::Tensor> buffer{unit.buffer};
    c10d::BroadcastOptions broadcast;
    broadcast.rootRank = 0;
    wait_for(group_->broadcast(buffer, broadcast), rank(), "the initial parameter broadcast");
    for (size_t i = 0; i < unit.params.size(); ++i) {
      auto& p = params_[unit.params[i]];
      p.set_data(unit.buffer.slice(0, unit.offsets[i], unit.offsets[i + 1]).view(p.sizes()));
    }
    if (!unit.root) {
      unit.grads = torch::empty({0}, tensor_options).resize_({unit.shard_size * world});
      set_storage_bytes(unit.grads, 0);
    }
    // The root's buffer is always there: its shard is a view of it, stepped in place.
    unit.shard = unit.buffer.slice(0, rank() * unit.shard_size, (rank() + 1) * unit.shard_size);
    if (!unit.root) unit.shard = unit.shard.clone();
    unit.gathered = true;
    release(unit);
  }

  if (options_.policy == GradShardPolicy::automatic) {
    std::vector<int64_t> gradient_bytes, shard_bytes;
    const int64_t element = static_cast<int64_t>(params_.front().element_size());
    for (const auto& unit : units_) {
      gradient_bytes.push_back((unit.offsets.back()) * element);
      shard_bytes.push_back(unit.shard_size * element);
    }
    auto choice = choose_unit_grad_shard_policies(gradient_bytes, shard_bytes, options_.available_bytes);
    for (size_t u = 0; u < units_.size(); ++u) units_[u].policy = choice.policies[u];
    policy_reason_ = std::move(choice.reason);
  } else {
    for (auto& unit : units_) unit.policy = options_.policy;
  }
}

bool ShardedParameters::can_stop_inside_window() const {
  return std::all_of(units_.begin(), units_.end(),
                     [](const FlatUnit& unit) { return unit.policy == GradShardPolicy::defer; });
}

std::string ShardedParameters::sharded_policy() const {
  const auto deferred = std::count_if(units_.begin(), units_.end(),
                                      [](const FlatUnit& unit) { return unit.policy == GradShardPolicy::defer; });
  if (deferred == static_cast<int64_t>(units_.size())) return grad_shard_policy_names().name(GradShardPolicy::defer);
  if (deferred == 0) return grad_shard_policy_names().name(GradShardPolicy::each_micro_step);
  return fmt::format("defer {} each_micro_step {}", deferred, static_cast<int64_t>(units_.size()) - deferred);
}

ShardedParameters::~ShardedParameters() {
  try {
    torch::NoGradGuard no_grad;
    for (auto& unit : units_) {
      if (unit.pending) unit.pending->wait();  // a forward cut short: its prefetch still writes
      if (unit.gathered) continue;
      set_storage_bytes(unit.buffer, buffer_bytes(unit, world_size()));
      unit.buffer.fill_(std::numeric_limits<double>::quiet_NaN());
      unit.buffer.slice(0, rank() * unit.shard_size, (rank() + 1) * unit.shard_size).copy_(unit.shard);
    }
  } catch (...) {
    // Out of memory in a destructor: the parameters keep no memory, as before.
  }
}

void ShardedParameters::start_gather(FlatUnit& unit) {
  if (unit.gathered) return;
  set_storage_bytes(unit.buffer, buffer_bytes(unit, world_size()));
  std::vector<std::vector<torch::Tensor>> output(1);
  for (int64_t r = 0; r < world_size(); ++r) {
    output[0].push_back(unit.buffer.slice(0, r * unit.shard_size, (r + 1) * unit.shard_size));
  }
  std::vector<torch::Tensor> input{unit.shard};
  unit.pending = group_->allgather(output, input);
  unit.gathered = true;
  ++window_gathers_;
}

void ShardedParameters::gather(FlatUnit& unit) {
  start_gather(unit);
  if (!unit.pending) return;
  auto work = std::move(unit.pending);
  wait_for(work, rank(), "a parameter all-gather");
}

void ShardedParameters::gather_for_forward(size_t u) {
  units_[u].forward_gathered = true;
  gather(units_[u]);
  if (u + 1 < unit_count_) start_gather(units_[u + 1]);
}

void ShardedParameters::gather_for_backward(size_t u) {
  units_[u].backward_gathered = true;
  gather(units_[u]);
  attach_gradients(units_[u]);
  if (u > 0) start_gather(units_[u - 1]);
}

void ShardedParameters::attach_gradients(FlatUnit& unit) {
  if (unit.root || unit.grads_attached) return;
  torch::NoGradGuard no_grad;
  set_storage_bytes(unit.grads, buffer_bytes(unit, world_size()));
  unit.grads.zero_();
  for (size_t i = 0; i < unit.params.size(); ++i) {
    auto& p = params_[unit.params[i]];
    auto view = unit.grads.slice(0, unit.offsets[i], unit.offsets[i + 1]).view(p.sizes());
    if (p.grad().defined()) view.copy_(p.grad());  // put back by a resumed checkpoint
    p.mutable_grad() = view;
  }
  unit.grads_attached = true;
}

void ShardedParameters::release(FlatUnit& unit) {
  if (unit.root || !unit.gathered || unsharded_) return;
  if (unit.pending) gather(unit);  // no memory is given back under a collective in flight
  set_storage_bytes(unit.buffer, 0);
  unit.gathered = false;
}

torch::Tensor ShardedParameters::enter(int64_t model_unit, const torch::Tensor& input) {
  if (unsharded_) return input;
  GA_CHECK(model_unit >= 0 && model_unit < static_cast<int64_t>(unit_of_model_unit_.size()),
           "zero_stage: 3: the model entered unit {} of the {} it declared", model_unit, unit_of_model_unit_.size());
  const int64_t u = unit_of_model_unit_[static_cast<size_t>(model_unit)];
  if (u < 0) return input;
  computed_ = true;
  gather_for_forward(static_cast<size_t>(u));
  if (!torch::GradMode::is_enabled() || !input.requires_grad()) return input;
  return UnitBoundaryNode::apply(input, this, u, /*unit_start=*/true);
}

torch::Tensor ShardedParameters::leave(int64_t model_unit, const torch::Tensor& output) {
  if (unsharded_) return output;
  const int64_t u = unit_of_model_unit_.at(static_cast<size_t>(model_unit));
  if (u < 0) return output;
  auto result = output;
  if (torch::GradMode::is_enabled() && output.requires_grad())
    result = UnitBoundaryNode::apply(output, this, u, /*unit_start=*/false);
  release(units_[static_cast<size_t>(u)]);
  return result;
}

void ShardedParameters::before_backward(bool last) {
  last_ = last;
  computed_ = false;
  abandoned_ = false;
  for (auto& unit : units_) unit.reduced = unit.forward_gathered = unit.backward_gathered = false;
  if (in_window_) return;
  in_window_ = true;
  for (auto& unit : units_) unit.grad_shard = torch::Tensor();  // stepped from; its memory goes back first
  window_calls_ = window_bytes_ = window_gathers_ = 0;
}

void ShardedParameters::finish_unit_backward(FlatUnit& unit) {
  if (reduce_due(unit)) reduce(unit);
  release(unit);
}

void ShardedParameters::replay_micro_step() {
  // A backward that began ran the whole forward (each unit gathered and released): its prefetch
  // for the next unit down may be in flight, so nothing is released here.
  bool backward_began = false;
  for (const auto& unit : units_) backward_began = backward_began || unit.backward_gathered;
  for (size_t u = 0; u < unit_count_ && !backward_began; ++u) {
    if (!units_[u].forward_gathered) gather_for_forward(u);
    release(units_[u]);
  }
  for (size_t u = unit_count_; u-- > 0;) {
    auto& unit = units_[u];
    if (!unit.backward_gathered) gather_for_backward(u);
    if (!(unit.reduced && reduce_due(unit))) finish_unit_backward(unit);
  }
}

void ShardedParameters::after_backward(bool) {
  if (!computed_ || abandoned_) {
    // No samples here this micro-step, or a micro-step that stopped part-way: the peers' gathers
    // and reductions that this rank has not run, in their order.
    replay_micro_step();
  } else {
    // A unit whose input needed no gradient (the first, below frozen embeddings) ends here.
    for (auto it = units_.rbegin(); it != units_.rend(); ++it) {
      if (it->root) continue;
      if (it->gathered) {
        finish_unit_backward(*it);
      } else if (reduce_due(*it) && !it->reduced) {
        reduce(*it);
      }
    }
  }
  if (!units_.back().root || !reduce_due(units_.back())) return;
  reduce(units_.back());
}

void ShardedParameters::finish_window(torch::Tensor& totals) {
  torch::NoGradGuard no_grad;
  for (auto& unit : units_) {
    if (!unit.grad_shard.defined()) unit.grad_shard = torch::zeros({unit.shard_size}, unit.shard.options());
  }
  std::vector<torch::Tensor> tensors{totals};
  wait_for(group_->allreduce(tensors), rank(), "the loss-total all-reduce");
  in_window_ = false;
  calls_ = window_calls_;
  bytes_ = window_bytes_;
  gathers_ = window_gathers_;
}

void ShardedParameters::reduce(FlatUnit& unit) {
  torch::NoGradGuard no_grad;
  const auto options = unit.shard.options();
  if (!unit.grad_shard.defined()) unit.grad_shard = torch::zeros({unit.shard_size}, options);
  const int64_t world = world_size();
  const int64_t element = static_cast<int64_t>(unit.shard.element_size());
  if (!unit.root) {
    // The unit's gradient is its flat buffer, laid out as the ranks' ranges: one reduce-scatter.
    attach_gradients(unit);
    auto received = torch::empty({unit.shard_size}, options);
    wait_for(group_->reduce_scatter_single(received, unit.grads), rank(), "a gradient reduce-scatter");
    unit.grad_shard.add_(received);
    ++window_calls_;
    window_bytes_ += unit.grads.numel() * element;
    for (const size_t k : unit.params) params_[k].mutable_grad() = torch::Tensor();
    set_storage_bytes(unit.grads, 0);
    unit.grads_attached = false;
    unit.reduced = true;
    return;
  }
  const int64_t chunk = std::clamp<int64_t>(options_.bucket_bytes / (world * element), 1, unit.shard_size);
  auto staging = torch::empty({world * chunk}, options);
  auto received = torch::empty({chunk}, options);
  for (int64_t c0 = 0; c0 < unit.shard_size; c0 += chunk) {
    const int64_t n = std::min(unit.shard_size, c0 + chunk) - c0;
    auto input = staging.slice(0, 0, world * n);
    input.zero_();
    // Rank r's piece: elements [r·S + c0, r·S + c0 + n) of the buffer, from the parameters' .grad.
    for (int64_t r = 0; r < world; ++r) {
      const int64_t lo = r * unit.shard_size + c0, hi = lo + n;
      for (size_t i = 0; i < unit.params.size(); ++i) {
        const auto& g = params_[unit.params[i]].grad();
        const int64_t a = std::max(lo, unit.offsets[i]), b = std::min(hi, unit.offsets[i + 1]);
        if (!g.defined() || a >= b) continue;
        input.slice(0, r * n + a - lo, r * n + b - lo)
            .copy_(g.reshape({-1}).slice(0, a - unit.offsets[i], b - unit.offsets[i]));
      }
    }
    auto output = received.slice(0, 0, n);
    wait_for(group_->reduce_scatter_single(output, input), rank(), "a gradient reduce-scatter");
    unit.grad_shard.slice(0, c0, c0 + n).add_(output);
    ++window_calls_;
    window_bytes_ += input.numel() * element;
  }
  for (const size_t k : unit.params) params_[k].mutable_grad() = torch::Tensor();
  unit.reduced = true;
}

std::vector<torch::Tensor> ShardedParameters::gradients(const std::vector<torch::Tensor>&) const {
  std::vector<torch::Tensor> shards;
  for (const auto& unit : units_) {
    if (unit.grad_shard.defined()) shards.push_back(unit.grad_shard);
  }
  return shards;
}

torch::Tensor ShardedParameters::global_norm(const std::vector<torch::Tensor>& gradients) {
  std::vector<torch::Tensor> squares{optim::tensors_norm(gradients).to(params_.front().device()).square().reshape({1})};
  wait_for(group_->allreduce(squares), rank(), "the gradient-norm all-reduce");
  return squares[0].sqrt().reshape({});
}

torch::Tensor ShardedParameters::weight_norm(const std::vector<torch::Tensor>&) {
  std::vector<torch::Tensor> shards;
  for (const auto& unit : units_) shards.push_back(unit.shard);
  std::vector<torch::Tensor> squares{optim::tensors_norm(shards).to(params_.front().device()).square().reshape({1})};
  wait_for(group_->allreduce(squares), rank(), "the weight-norm all-reduce");
  return squares[0].sqrt().reshape({});
}

void ShardedParameters::with_whole_parameters(const std::function<void()>& fn) {
  if (unsharded_) {
    fn();
    return;
  }
  for (auto& unit : units_) gather(unit);
  unsharded_ = true;
  // Sharded again whether fn returns or throws (a checkpoint that could not be written, and
  // training goes on).
  const auto reshard = [&] {
    unsharded_ = false;
    torch::NoGradGuard no_grad;
    for (auto& unit : units_) {
      if (unit.root) continue;  // its shard is a view of its buffer
      unit.shard.copy_(unit.buffer.slice(0, rank() * unit.shard_size, (rank() + 1) * unit.shard_size));
      release(unit);
    }
  };
  try {
    fn();
  } catch (...) {
    reshard();
    throw;
  }
  reshard();
}

void ShardedParameters::unshard() {
  for (auto& unit : units_) gather(unit);
  unsharded_ = true;
}

void ShardedParameters::after_optimizer_step() {
  if (!units_.back().root) return;
  auto& root = units_.back();
  std::vector<std::vector<torch::Tensor>> output(1);
  for (int64_t r = 0; r < world_size(); ++r) {
    output[0].push_back(root.buffer.slice(0, r * root.shard_size, (r + 1) * root.shard_size));
  }
  // This rank's piece is its shard already (a view of the same elements): a copy for the input.
  std::vector<torch::Tensor> input{root.shard.clone()};
  wait_for(group_->allgather(output, input), rank(), "the root parameters' all-gather");
}

int64_t ShardedParameters::held_parameter_bytes() const {
  std::set<const void*> storages;
  int64_t bytes = 0;
  for (const auto& unit : units_) {
    for (const auto* t : {&unit.buffer, &unit.shard}) {
      if (storages.insert(t->storage().unsafeGetStorageImpl()).second) {
        bytes += static_cast<int64_t>(t->storage().nbytes());
      }
    }
  }
  return bytes;
}

int64_t ShardedParameters::held_gradient_bytes() const {
  std::set<const void*> storages;
  int64_t bytes = 0;
  auto count = [&](const torch::Tensor& t) {
    if (t.defined() && storages.insert(t.storage().unsafeGetStorageImpl()).second) {
      bytes += static_cast<int64_t>(t.storage().nbytes());
    }
  };
  for (const auto& p : params_) count(p.grad());
  for (const auto& unit : units_) count(unit.grad_shard);
  return bytes;
}

}  // namespace gradaccum::dist
