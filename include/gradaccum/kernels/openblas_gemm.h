// Single-precision GEMM through OpenBLAS, loaded at run time, for the products
// where the torch wheel's BLAS is slow: the wheel links Intel's MKL, and on AMD
// CPUs MKL runs the LM head's vocabulary-wide products (C = H·Wᵀ with W
// [50257, 768], and Wᵀ's gradient) at 0.55–0.85 of OpenBLAS's rate, while the
// narrower products of a transformer block run alike in both
// (docs/benchmarks-history.md, "GPT-2 small's LM head through OpenBLAS").
// models/chunked_cross_entropy.cpp
// routes the head's three products here where openblas_preferred() holds.
//
// Which OpenBLAS: Debian's OpenMP build (libopenblas0-openmp, which
// scripts/setup.sh installs), then whatever `libopenblas.so.0` the loader
// finds, in both cases only an OpenMP build. It is opened privately
// (RTLD_LOCAL), so libtorch keeps its own BLAS, and it shares the process's
// OpenMP runtime with libtorch (both name libgomp.so.1, loaded once): its
// threads are libtorch's threads, at::get_num_threads() of them, and no second
// pool spins beside them. Where none loads, the callers use libtorch. Nor is it
// loaded in a process whose address space is limited (RLIMIT_AS, `ulimit -v`)
// or under strict overcommit: OpenBLAS reserves 128 MiB per thread as it loads
// and retries a failed reservation forever.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace gradaccum::kernels {

// Whether an OpenMP OpenBLAS was loaded (looked for once, on first use; not in
// a process with an address-space limit or under strict overcommit).
bool openblas_gemm_available();

// The loaded OpenBLAS's own description (its version, "USE_OPENMP", the CPU
// core it chose), or "" when none was loaded.
const std::string& openblas_config();

// Whether this process prefers OpenBLAS for the vocabulary-wide products: one
// was loaded and libtorch's BLAS is MKL on a CPU that is not Intel's. On Intel
// CPUs MKL runs its own best code, and the wheel's path is kept (not measured
// against OpenBLAS here).
bool openblas_preferred();

// C = alpha · op(A) · op(B) + beta · C, all row-major: op(A) is [m, k], op(B)
// [k, n], C [m, n]; lda, ldb, ldc are the row strides of A, B, C as stored
// (A is stored [k, m] when trans_a). Dimensions and strides must fit in int
// (OpenBLAS's LP64 interface). Call from outside any parallel region: OpenBLAS
// runs the product on the process's OpenMP threads. Requires
// openblas_gemm_available().
void openblas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// torch::mm(a, b) and c.addmm_(a, b) through openblas_gemm: float32 CPU
// matrices, each row-major or the transposed view of one (`w.t()`), any other
// layout copied first; c contiguous. The product is a new contiguous tensor.
torch::Tensor openblas_mm(const torch::Tensor& a, const torch::Tensor& b);
void openblas_addmm_(torch::Tensor& c, const torch::Tensor& a, const torch::Tensor& b);

}  // namespace gradaccum::kernels
