// Which vector build of ATen's CPU kernels (element-wise ops, softmax, norms,
// reductions) this process runs.
//
// ATen compiles each kernel for DEFAULT, AVX2 and AVX512 and picks one set per
// process at its first kernel call, from ATEN_CPU_CAPABILITY or else the CPU.
// PyTorch 1.13 never picks AVX512 by itself (pytorch#80252: on the first
// AVX-512 Xeons, Skylake-SP, the clock drop made it slower than AVX2). CPUs
// with AVX512-BF16 (Cooper Lake, Sapphire Rapids and later Xeons, Zen 4) run
// AVX-512 without that penalty: on this project's Xeons one micro-step of the
// 3.4M-parameter GPT of bench/lm_loss_ab takes 60.7 ms with the AVX512 kernels
// and 64.8 ms with the AVX2 ones (1 thread, micro-batch 2, medians of 3
// alternating processes each; BENCHMARKS.md). GELU(tanh) alone runs 1.6x faster.
#pragma once

#include <string>

namespace gradaccum::io {

struct AtenKernelSelection {
  std::string capability;  // "AVX512", "AVX2", "DEFAULT", ... as ATen reports it; "" if unknown
  std::string reason;      // one line: why
};

// Whether the CPU (and the OS) offer AVX-512 with BF16: the condition for the AVX512 kernels.
bool cpu_has_avx512_bf16();

// Process-wide, once, at program start, before any tensor operation: when
// ATEN_CPU_CAPABILITY is unset and the CPU has AVX-512 with BF16, makes ATen
// choose its AVX512 kernels. Like select_blas_kernels(), it leaves the
// environment as it found it. Later calls return the first call's result.
const AtenKernelSelection& select_aten_kernels();

// The kernel set ATen uses in this process, named as ATEN_CPU_CAPABILITY names
// it: "AVX512", "AVX2" or "DEFAULT" (from at::show_config()).
std::string aten_capability();

}  // namespace gradaccum::io
