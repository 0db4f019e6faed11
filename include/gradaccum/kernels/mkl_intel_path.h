// MKL's own fast code on CPUs that are not Intel's. The torch wheel links
// Intel's MKL, which picks its code by CPU vendor as well as by instruction
// set: on an AMD CPU with AVX2 and FMA it runs slower generic code, and the
// float32 GEMMs of a transformer step ran at 60–100 GFLOP/s on a 2-core AMD
// EPYC against 120–150 with MKL's Intel code on the same cores
// (docs/benchmarks-history.md, "MKL's Intel code path on AMD CPUs"). The
// instruction sets MKL then uses are still those CPUID reports.
//
// MKL asks two functions of its own whether the CPU is Intel's
// (mkl_serv_intel_cpu_true, mkl_serv_intel_cpu; the torch wheel exports both
// from libtorch_cpu.so). libgradaccum defines both; a program that links
// libgradaccum before libtorch (as CMake's target_link_libraries(app
// gradaccum::gradaccum) does) has its calls answered here: "Intel" while the
// custom kernel `mkl_intel_path` is on, MKL's own answer otherwise. MKL asks
// once and keeps the answer, so the setting in force at the process's first
// MKL call holds for the rest of it: set custom_kernels before the first GEMM
// (the CLI and run::fit do). On Intel CPUs both answers are the same.
#pragma once

#include <string>

namespace gradaccum::kernels {

// Whether MKL runs (or, before its first call, will run) its Intel code on a
// CPU that is not Intel's: libtorch's BLAS is MKL, the CPU is not Intel's, its
// vendor checks reach libgradaccum, and mkl_intel_path was on when MKL first
// asked (is on now, if it has not asked yet).
bool mkl_intel_path_active();

// Whether MKL has asked yet (from then on the answer is fixed).
bool mkl_intel_path_decided();

// For `gradaccum --version` and run logs: "MKL's Intel code path on this
// AuthenticAMD CPU", or "" where the path is not active.
std::string mkl_intel_path_description();

}  // namespace gradaccum::kernels
