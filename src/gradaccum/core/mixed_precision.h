// Mixed precision as the accumulation loop sees it (DESIGN.md §1, issue 5).
//
// Parameters, optimizer state and the gradient accumulation buffers (the
// parameters' .grad) stay float32 in every mode: autocast casts a weight to
// 16 bits for a matmul and autograd casts the weight's gradient back, so each
// micro-step's gradient is added to an fp32 buffer. Only the forward's
// autocast-listed ops (matmul, linear, convolution) run in 16 bits; losses and
// reductions stay fp32.
//
//   bf16: autocast to bfloat16 (CPU and CUDA). bfloat16 has float32's exponent
//         range, so no loss scaling is needed.
//   fp16: autocast to float16 on CUDA, with a dynamic loss scaler
//         (optim/loss_scaler.h). On the CPU fp16 is emulated (written for
//         libtorch 1.13, which had no CPU fp16 autocast; 2.x has it, but with a
//         ~20x slower fp16 GEMM on CPUs without AVX512-FP16): the forward runs in float32 and every micro-step's
//         (scaled) parameter gradient is rounded to float16 before it is added
//         to the fp32 buffer — the cast CUDA autocast performs at exactly that
//         point. That reproduces fp16's range (overflow to inf, flush to zero:
//         what the scaler exists for) at the accumulation boundary, but not
//         fp16 rounding inside the network. It is for testing the scaler's
//         logic and tracking curves on machines without a GPU, not for speed.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace gradaccum::core {

enum class MixedPrecision { none, bf16, fp16 };

// "no" | "bf16" | "fp16" (the config's spelling); throws gradaccum::Error otherwise.
MixedPrecision parse_mixed_precision(const std::string& name);
std::string to_string(MixedPrecision precision);

// The 16-bit dtype of `precision`'s autocast regions (undefined for none).
torch::ScalarType autocast_dtype(MixedPrecision precision);

// True when `precision` on `device` runs real autocast (false for none, and for
// fp16 on CPU, which is emulated).
bool uses_autocast(MixedPrecision precision, const torch::Device& device);

// Enables autocast for `device`'s type with `precision`'s dtype for its
// lifetime, as torch.autocast does; restores the previous state (and drops the
// cast-weight cache when the outermost region ends). A no-op when
// uses_autocast() is false. Wrap the forward and the loss, not the backward.
class AutocastScope {
 public:
  AutocastScope(MixedPrecision precision, const torch::Device& device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_type_ = c10::DeviceType::CPU;
  bool previous_enabled_ = false;
  torch::ScalarType previous_dtype_ = torch::kBFloat16;
};

// CPU emulation of fp16 gradients (see above): registers a hook on each
// parameter that rounds every incoming gradient to float16 and back before it
// is accumulated. Hooks are removed when the object dies.
class Fp16GradientRounding {
 public:
  explicit Fp16GradientRounding(const std::vector<torch::Tensor>& params);
  ~Fp16GradientRounding();
  Fp16GradientRounding(const Fp16GradientRounding&) = delete;
  Fp16GradientRounding& operator=(const Fp16GradientRounding&) = delete;

 private:
  std::vector<std::pair<torch::Tensor, unsigned>> hooks_;
};

}  // namespace gradaccum::core
