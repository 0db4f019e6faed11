// The engine's hand-written CPU kernels, and the one process-wide switch over
// them: the config key `custom_kernels` (`all`, `none`, or a comma-separated
// list of the names below). Every kernel and its support lives in this folder
// (kernels/), below every layer that calls it; a caller asks for the operation
// (kernels::gelu_tanh(x), ...) and the kernel decides, from this switch and its
// inputs, whether it runs itself or libtorch's path.
//
// Each kernel replaces a sequence of libtorch operators that computes the same
// function; it stays in the engine only while bench/custom_kernels.py shows it
// beating libtorch's own path by ≥ 5% end to end on the benchmark it serves
// (BENCHMARKS.md). Turning one off runs that libtorch path instead: to debug a
// suspected kernel, and to repeat the comparison. Like torch.backends' flags
// (e.g. enable_flash_sdp), the switch is process-wide; a run's
// run::ProcessSetup sets it before a model is built and puts it back after, and
// library code only reads it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace gradaccum::kernels {

enum class CustomKernel {
  qkv_attention,          // kernels/qkv_attention.h: attention's forward and backward
  gelu_tanh,              // kernels/gelu_tanh.h: GPT-2's and BLOOM's GELU
  softmax_cross_entropy,  // kernels/softmax_cross_entropy.h: the LM head's loss rows
  gelu_mlp,               // kernels/gelu_mlp.h: seed 000's Linear → GELU → Linear as one node
  heap_retention,         // kernels/heap_retention.h: glibc keeps freed activations
  group_norm,             // kernels/group_norm.h: GroupNorm on channels-last images
  mkl_intel_path,         // kernels/mkl_intel_path.h: MKL's Intel code on other vendors' CPUs
};

// Every kernel's name, in enum order ("qkv_attention", ...).
const std::vector<std::string_view>& custom_kernel_names();

// Whether `kernel` runs where its conditions hold. All are on at start-up.
bool custom_kernel_enabled(CustomKernel kernel);

// The kernels a spec names: "all", "none", or names separated by commas (e.g.
// "qkv_attention,gelu_mlp"). Throws gradaccum::Error naming an unknown name.
std::vector<CustomKernel> parse_custom_kernels(std::string_view spec);

// Exactly the kernels parse_custom_kernels(spec) names are on afterwards.
void set_custom_kernels(std::string_view spec);

// The spec that names every kernel but `kernel` (e.g. to compare one kernel's path
// against libtorch's with all the others on).
std::string custom_kernels_without(CustomKernel kernel);

// The kernels that are on, comma-separated, or "none".
std::string custom_kernels_description();

}  // namespace gradaccum::kernels
