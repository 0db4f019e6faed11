// Row-major GEMM straight through the process's BLAS (the sgemm_/dgemm_ that
// libtorch itself calls, looked up at run time), for the many small products
// of a kernel that runs inside its own parallel region: attention's
// [T, D] × [D, T] per batch and head. Through libtorch each such product costs
// an operator dispatch, views and checks (~microseconds, as much as a
// 128 × 128 × 64 product itself); here it is one call. Inside a parallel
// region the OpenMP OpenBLAS runs it on the calling thread.
#pragma once

#include <cstdint>

namespace gradaccum::kernels {

// Whether the loaded BLAS exports sgemm_ and dgemm_ (libtorch links one that does;
// callers fall back to libtorch's operators when not).
bool blas_gemm_available();

// C = alpha · op(A) · op(B) + beta · C, all row-major: op(A) is [m, k], op(B)
// [k, n], C [m, n]; lda, ldb, ldc are the row strides of A, B, C as stored
// (A is stored [k, m] when trans_a). Dimensions and strides must fit in int
// (the BLAS's LP64 interface). Requires blas_gemm_available().
void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
               const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

}  // namespace gradaccum::kernels
