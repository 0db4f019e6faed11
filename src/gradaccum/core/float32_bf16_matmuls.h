// bf16 autocast on CPUs whose libtorch has no fast, exact bfloat16 GEMM.
//
// libtorch 1.13 multiplies bfloat16 matrices with oneDNN on CPUs with AVX-512
// and with its own fallback GEMM elsewhere. That fallback is slow (5.3 GFLOP/s
// on an AVX2 EPYC, against 154 for float32 in OpenBLAS) and sums in bfloat16
// when untransposed: 3.7% relative error over 1024 terms and 10% over 8192,
// against 0.17% for rounding a float32-summed product. Its convolutions behave
// the same way (2.7% over 576 terms). bf16 hardware (AMX, AVX512-BF16, GPUs)
// multiplies bfloat16 values and sums in float32.
//
// route_cpu_bf16_matmuls_through_float32() makes CPU autocast do that for the
// ops that it runs in bfloat16 (linear, matmul, mm, addmm, bmm, baddbmm, conv1d,
// conv2d): each floating operand is rounded to bfloat16 as autocast would, the op
// runs in float32 on those values, and the result is rounded to bfloat16.
// Autograd records the casts, so the backward rounds the gradients to bfloat16
// where autocast's would be bfloat16, and runs its products in float32 too.
// Results equal bfloat16 hardware's up to the float32 summation order.
//
// Why hand-written: PyTorch has no switch for this. The routing replaces those
// ops' AutocastCPU kernels in libtorch's dispatcher, process-wide and for the
// rest of the process, and only ever from float32-producing bfloat16 autocast.
#pragma once

#include <torch/torch.h>

#include <string>

#include "gradaccum/core/mixed_precision.h"

namespace gradaccum::core {

// Whether a run routes: bf16 autocast on a CPU device, and `setting` (the
// config key bf16_cpu_matmuls) is "float32", or "auto" on a CPU without AVX-512
// (`cpu_has_avx512`, cpu_has_avx512()); never for "libtorch".
bool routes_bf16_matmuls_through_float32(const std::string& setting, MixedPrecision precision,
                                         const torch::Device& device, bool cpu_has_avx512);

// Whether ATen runs its AVX-512 kernels in this process (at::get_cpu_capability(); libtorch 2.x
// picks them wherever the CPU has AVX-512): the CPUs whose bf16 GEMMs are native.
bool cpu_has_avx512();

// Installs the routing once per process; later calls do nothing. Affects only
// code that runs under CPU autocast with dtype bfloat16.
void route_cpu_bf16_matmuls_through_float32();

// Whether route_cpu_bf16_matmuls_through_float32() has run in this process.
bool cpu_bf16_matmuls_route_through_float32();

}  // namespace gradaccum::core
