#include "gradaccum/models/activation_checkpoint.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Optional.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <mutex>
#include <utility>

#include "gradaccum/base/check.h"

namespace gradaccum::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Autocast's thread-local switches and dtypes for CPU and CUDA.
struct AutocastState {
  bool cpu_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  bool cuda_enabled = false;
  at::ScalarType cuda_dtype = at::kHalf;

  static AutocastState current() {
    return {at::autocast::is_autocast_enabled(at::kCPU), at::autocast::get_autocast_dtype(at::kCPU),
            at::autocast::is_autocast_enabled(at::kCUDA), at::autocast::get_autocast_dtype(at::kCUDA)};
  }
  void make_current() const {
    at::autocast::set_autocast_enabled(at::kCPU, cpu_enabled);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_enabled);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
  }
  bool any_enabled() const { return cpu_enabled || cuda_enabled; }
};

// Makes `state` the autocast state for its lifetime, then restores the
// previous one. Casts cached under `state` are dropped on exit, as Python's
// autocast does when its outermost region ends: a cached cast holds the graph
// of this recompute and the weight's value of this step, and must not be
// reused by a later forward.
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& state) : previous_(AutocastState::current()) {
    state.make_current();
    clear_cache_ = state.any_enabled();
  }
  ~AutocastScope() {
    previous_.make_current();
    if (clear_cache_) at::autocast::clear_cache();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState previous_;
  bool clear_cache_ = false;
};

// Turns autocast's weight-cast cache off for its lifetime. The checkpointed
// forward runs without grad: a weight cast cached there has no grad_fn, and a
// later grad-mode use of the same weight in the same autocast region (the
// recompute, a tied weight) would pick it up and cut the weight off the graph.
class AutocastCacheOff {
 public:
  AutocastCacheOff() : previous_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(previous_); }
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;

 private:
  bool previous_;
};

// See Note [Acquire lock when using random generators] in ATen.
at::Tensor generator_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}
void set_generator_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// The default generators' states: CPU always, CUDA for one device when the
// checkpointed inputs live there (as torch.utils.checkpoint does).
struct RngState {
  at::Tensor cpu;
  c10::optional<at::Device> cuda_device;
  at::Tensor cuda;

  static RngState current(c10::optional<at::Device> cuda_device) {
    RngState s;
    s.cpu = generator_state(at::globalContext().defaultGenerator(at::kCPU));
    s.cuda_device = cuda_device;
    if (cuda_device) s.cuda = generator_state(at::globalContext().defaultGenerator(*cuda_device));
    return s;
  }
  void make_current() const {
    set_generator_state(at::globalContext().defaultGenerator(at::kCPU), cpu);
    if (cuda_device) set_generator_state(at::globalContext().defaultGenerator(*cuda_device), cuda);
  }
};

// Resets the generators to `state` for its lifetime, then puts back the states
// they had: the recompute redraws the forward's random numbers without moving
// the streams that the rest of training sees.
class RngFork {
 public:
  explicit RngFork(const RngState& state) : previous_(RngState::current(state.cuda_device)) { state.make_current(); }
  ~RngFork() { previous_.make_current(); }
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  RngState previous_;
};

// What the backward needs besides the saved inputs. AutogradContext stores
// only IValues, so it travels as a capsule.
struct CheckpointState : torch::CustomClassHolder {
  CheckpointFn fn;
  size_t num_inputs = 0;  // the caller's inputs; a trailing placeholder may follow
  AutocastState autocast;
  RngState rng;
};

c10::optional<at::Device> first_cuda_device(const std::vector<torch::Tensor>& inputs) {
  for (const auto& t : inputs)
    if (t.is_cuda()) return t.device();
  return c10::nullopt;
}

torch::Tensor call(const CheckpointFn& fn, const std::vector<torch::Tensor>& inputs) {
  auto output = fn(inputs);
  GA_CHECK(output.defined(),
           "activation checkpoint: the checkpointed function returned an "
           "undefined tensor");
  return output;
}

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // Runs under the no-grad mode Function::apply sets: no activation is kept.
  static torch::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<CheckpointState> state, at::TensorList args) {
    ctx->save_for_backward(args.vec());
    const std::vector<torch::Tensor> inputs(args.begin(), args.begin() + state->num_inputs);
    state->autocast = AutocastState::current();
    state->rng = RngState::current(first_cuda_device(inputs));
    torch::Tensor output;
    {
      AutocastCacheOff no_cache;
      output = call(state->fn, inputs);
    }
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    // Fresh leaves: the inner backward stops at them and leaves their gradient
    // in .grad, which this node hands on to the outer graph.
    std::vector<torch::Tensor> inputs;
    inputs.reserve(state->num_inputs);
    for (size_t i = 0; i < state->num_inputs; ++i) {
      auto leaf = saved[i].detach();
      if (saved[i].requires_grad()) leaf.requires_grad_(true);
      inputs.push_back(std::move(leaf));
    }
    torch::Tensor output;
    {
      RngFork rng(state->rng);
      AutocastScope autocast(state->autocast);
      torch::AutoGradMode grad(true);  // the engine runs backward nodes without grad
      output = call(state->fn, inputs);
    }
    // Outside the autocast scope, as a plain backward runs outside the
    // forward's autocast region. Parameters inside fn accumulate .grad here
    // (their hooks fire here too).
    if (output.requires_grad()) torch::autograd::backward({output}, {grad_outputs.at(0)});

    variable_list grads;  // one per forward argument: the state, then each tensor
    grads.reserve(1 + saved.size());
    grads.emplace_back();
    for (const auto& input : inputs) grads.push_back(input.requires_grad() ? input.grad() : torch::Tensor());
    grads.resize(1 + saved.size());  // the placeholder, if any: no gradient
    return grads;
  }
};

}  // namespace

torch::Tensor checkpoint(const CheckpointFn& fn, const std::vector<torch::Tensor>& inputs,
                         const std::vector<torch::Tensor>& parameters) {
  for (size_t i = 0; i < inputs.size(); ++i)
    GA_CHECK(inputs[i].defined(), "activation checkpoint: input {} of {} is undefined", i, inputs.size());
  auto requires_grad = [](const torch::Tensor& t) { return t.defined() && t.requires_grad(); };
  const bool input_needs_grad = std::any_of(inputs.begin(), inputs.end(), requires_grad);
  const bool parameter_needs_grad = std::any_of(parameters.begin(), parameters.end(), requires_grad);
  if (!torch::GradMode::is_enabled() || !(input_needs_grad || parameter_needs_grad)) return call(fn, inputs);

  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  state->num_inputs = inputs.size();
  std::vector<torch::Tensor> args = inputs;
  // Only trainable parameters inside fn, no trainable input: the custom
  // Function's output would not require grad and its backward would never
  // run. An empty leaf that requires grad makes the node part of the graph;
  // it receives no gradient.
  if (!input_needs_grad) args.push_back(torch::empty({0}).requires_grad_(true));
  return CheckpointFunction::apply(std::move(state), at::TensorList(args));
}

}  // namespace gradaccum::models
