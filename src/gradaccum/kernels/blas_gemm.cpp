#include "gradaccum/kernels/blas_gemm.h"

#include <dlfcn.h>

#include <cstddef>

namespace gradaccum::kernels {
namespace {

// The Fortran BLAS interface: every argument by pointer, column-major, and the
// lengths of the two character arguments appended (gfortran's convention;
// implementations in C ignore them).
template <typename T>
using FortranGemm = void (*)(const char* trans_a, const char* trans_b, const int* m, const int* n, const int* k,
                             const T* alpha, const T* a, const int* lda, const T* b, const int* ldb, const T* beta,
                             T* c, const int* ldc, std::size_t, std::size_t);

template <typename T>
FortranGemm<T> lookup(const char* name) {
  return reinterpret_cast<FortranGemm<T>>(dlsym(RTLD_DEFAULT, name));
}

FortranGemm<float> sgemm() {
  static const auto fn = lookup<float>("sgemm_");
  return fn;
}

FortranGemm<double> dgemm() {
  static const auto fn = lookup<double>("dgemm_");
  return fn;
}

// A row-major product is the column-major product of the transposes:
// C = op(A)·op(B) ⇔ Cᵀ = op(B)ᵀ·op(A)ᵀ, and a row-major matrix with row stride
// ld is its transpose in column-major with leading dimension ld.
template <typename T>
void row_major(FortranGemm<T> gemm, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
               int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
  const int im = static_cast<int>(n), in = static_cast<int>(m), ik = static_cast<int>(k);
  const int ia = static_cast<int>(ldb), ib = static_cast<int>(lda), ic = static_cast<int>(ldc);
  gemm(&ta, &tb, &im, &in, &ik, &alpha, b, &ia, a, &ib, &beta, c, &ic, 1, 1);
}

}  // namespace

bool blas_gemm_available() { return sgemm() != nullptr && dgemm() != nullptr; }

void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  row_major(sgemm(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
               const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  row_major(dgemm(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace gradaccum::kernels
