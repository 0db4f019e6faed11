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
//   fp16: autocast to float16 (CPU and CUDA), with a dynamic loss scaler
//         (optim/loss_scaler.h). A CPU without AVX512-FP16 multiplies float16
//         matrices ~20x slower than float32 ones; there `gradaccum train` routes
//         autocast's matmuls to float32 GEMMs on float16-rounded operands
//         (kernels/float32_cpu_matmuls.h), which keeps fp16's rounding and range.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "gradaccum/base/enum_names.h"

namespace gradaccum::core {

enum class MixedPrecision { none, bf16, fp16 };

// "no" | "bf16" | "fp16" (the config's spelling).
const base::EnumNames<MixedPrecision>& mixed_precision_names();
std::string to_string(MixedPrecision precision);

// How bf16 autocast multiplies on a CPU (the config key bf16_cpu_matmuls): `float32` GEMMs on
// bfloat16-rounded operands (kernels/float32_cpu_matmuls.h), libtorch's own bfloat16 GEMMs, or
// `automatic` ("auto"): float32 where the CPU has no bfloat16 instructions.
enum class Bf16CpuMatmuls { automatic, float32, libtorch };
const base::EnumNames<Bf16CpuMatmuls>& bf16_cpu_matmuls_names();
std::string to_string(Bf16CpuMatmuls matmuls);

// The 16-bit dtype of `precision`'s autocast regions (undefined for none).
torch::ScalarType autocast_dtype(MixedPrecision precision);

// True when `precision` on `device` runs autocast: bf16 or fp16 on a CPU or a
// CUDA device.
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

}  // namespace gradaccum::core
