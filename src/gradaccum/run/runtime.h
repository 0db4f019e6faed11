// Process set-up shared by the commands: threads, how CPU autocast multiplies, and what the
// program reports about the libtorch it runs on.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

#include "gradaccum/core/mixed_precision.h"

namespace gradaccum::run {

// Sets libtorch's intra-op threads to `requested`, or (0) this host's cores shared among its
// `local_ranks`. Returns the count set.
int configure_threads(int64_t requested, int64_t local_ranks);

// Whether a run routes CPU autocast's matmuls through float32 GEMMs on 16-bit-rounded operands
// (kernels/float32_cpu_matmuls.h), on a CPU device only:
//   bf16: when `bf16_setting` (the config key bf16_cpu_matmuls) is float32, or
//         automatic on a CPU without bfloat16 instructions (`cpu_has_native_bf16`,
//         kernels::cpu_has_native_bf16()); never for libtorch;
//   fp16: on a CPU without float16 instructions (`cpu_has_native_fp16`).
bool routes_cpu_matmuls_through_float32(core::Bf16CpuMatmuls bf16_setting, core::MixedPrecision precision,
                                        const c10::Device& device, bool cpu_has_native_bf16, bool cpu_has_native_fp16);

// One line: the libtorch version this program was built against and whether this build can use
// CUDA devices, e.g. "2.15.0 (CPU libraries; the wheel is a CUDA 13.2 build)".
std::string libtorch_description();
// One line: the BLAS serving libtorch's GEMMs and ATen's CPU kernel set, as libtorch reports them,
// e.g. "BLAS mkl, ATen AVX512 kernels", or on an AMD CPU "BLAS mkl (MKL's Intel code path on this
// AuthenticAMD CPU), ATen AVX2 kernels" (kernels/mkl_intel_path.h).
std::string kernels_description();

}  // namespace gradaccum::run
