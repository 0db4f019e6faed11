#include "gradaccum/core/mixed_precision.h"

#include <ATen/autocast_mode.h>

#include "gradaccum/base/check.h"

namespace gradaccum::core {

const base::EnumNames<MixedPrecision>& mixed_precision_names() {
  static const base::EnumNames<MixedPrecision> names{
      {MixedPrecision::none, "no"}, {MixedPrecision::bf16, "bf16"}, {MixedPrecision::fp16, "fp16"}};
  return names;
}

std::string to_string(MixedPrecision precision) { return mixed_precision_names().name(precision); }

const base::EnumNames<Bf16CpuMatmuls>& bf16_cpu_matmuls_names() {
  static const base::EnumNames<Bf16CpuMatmuls> names{{Bf16CpuMatmuls::automatic, "auto"},
                                                     {Bf16CpuMatmuls::float32, "float32"},
                                                     {Bf16CpuMatmuls::libtorch, "libtorch"}};
  return names;
}

std::string to_string(Bf16CpuMatmuls matmuls) { return bf16_cpu_matmuls_names().name(matmuls); }

torch::ScalarType autocast_dtype(MixedPrecision precision) {
  switch (precision) {
    case MixedPrecision::bf16:
      return torch::kBFloat16;
    case MixedPrecision::fp16:
      return torch::kHalf;
    case MixedPrecision::none:
      break;
  }
  return torch::ScalarType::Undefined;
}

bool uses_autocast(MixedPrecision precision, const torch::Device& device) {
  return precision != MixedPrecision::none && (device.is_cpu() || device.is_cuda());
}

AutocastScope::AutocastScope(MixedPrecision precision, const torch::Device& device) {
  if (!uses_autocast(precision, device)) return;
  active_ = true;
  device_type_ = device.type();
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, autocast_dtype(precision));
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
  // The cache holds 16-bit copies of the weights, valid only until they change.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

}  // namespace gradaccum::core
