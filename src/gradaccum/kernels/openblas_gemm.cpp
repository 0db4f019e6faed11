#include "gradaccum/kernels/openblas_gemm.h"

#include <dlfcn.h>
#include <sys/resource.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <string>

#include "gradaccum/base/check.h"
#include "gradaccum/kernels/cpu_and_blas.h"

namespace gradaccum::kernels {
namespace {

// CBLAS's enumerations (cblas.h), fixed by the standard interface.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
using CblasSgemm = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a,
                            int lda, const float* b, int ldb, float beta, float* c, int ldc);

struct OpenBlas {
  CblasSgemm sgemm = nullptr;
  std::string config;
};

#if defined(__x86_64__)
constexpr const char* kDebianOpenmpBuild = "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0";
#elif defined(__aarch64__)
constexpr const char* kDebianOpenmpBuild = "/usr/lib/aarch64-linux-gnu/openblas-openmp/libopenblas.so.0";
#else
constexpr const char* kDebianOpenmpBuild = "libopenblas.so.0";
#endif

// An OpenMP OpenBLAS from `path`, or nothing. A pthreads build would keep a
// second pool of threads spinning beside libtorch's after every call, a serial
// one would run on one thread: both are closed again.
OpenBlas open_openmp_build(const char* path) {
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return {};
  const auto sgemm = reinterpret_cast<CblasSgemm>(dlsym(handle, "cblas_sgemm"));
  const auto parallel = reinterpret_cast<int (*)()>(dlsym(handle, "openblas_get_parallel"));
  const auto config = reinterpret_cast<const char* (*)()>(dlsym(handle, "openblas_get_config"));
  constexpr int kOpenmp = 2;  // openblas_get_parallel(): 0 serial, 1 pthreads, 2 OpenMP
  if (sgemm == nullptr || parallel == nullptr || parallel() != kOpenmp) {
    dlclose(handle);
    return {};
  }
  return {sgemm, config != nullptr ? std::string(config()) : std::string("OpenBLAS")};
}

// OpenBLAS reserves a buffer of 128 MiB per thread while it loads and, when a
// reservation fails, retries forever: under `ulimit -v` the process hangs inside
// dlopen. Such a reservation fails only where the address space is limited
// (RLIMIT_AS) or commits are strict (vm.overcommit_memory = 2), so OpenBLAS is
// not loaded there (libtorch's BLAS serves every product).
bool reservations_can_fail() {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) return true;
  std::ifstream overcommit("/proc/sys/vm/overcommit_memory");
  int mode = 0;
  return overcommit >> mode && mode == 2;
}

const OpenBlas& openblas() {
  static const OpenBlas loaded = [] {
    if (reservations_can_fail()) return OpenBlas{};
    for (const char* path : {kDebianOpenmpBuild, "libopenblas.so.0"}) {
      if (auto found = open_openmp_build(path); found.sgemm != nullptr) return found;
    }
    return OpenBlas{};
  }();
  return loaded;
}

// A float32 CPU matrix as BLAS reads it: row-major with row stride `ld`, or
// the transpose of such a matrix.
struct BlasOperand {
  torch::Tensor storage;  // keeps a copy alive when one was needed
  bool transposed = false;
  int64_t ld = 1;
};

BlasOperand blas_operand(const torch::Tensor& t) {
  GA_CHECK(t.dim() == 2 && t.scalar_type() == torch::kFloat && t.is_cpu(),
           "openblas_mm: operands must be 2-D float32 CPU tensors");
  const int64_t rows = t.size(0), cols = t.size(1);
  if (t.stride(1) == 1 && t.stride(0) >= std::max<int64_t>(1, cols)) return {t, false, t.stride(0)};
  if (t.stride(0) == 1 && t.stride(1) >= std::max<int64_t>(1, rows)) return {t, true, t.stride(1)};
  auto copy = t.contiguous();
  return {copy, false, std::max<int64_t>(1, cols)};
}

void product_into(torch::Tensor& c, const torch::Tensor& a, const torch::Tensor& b, float beta) {
  GA_CHECK(a.dim() == 2 && b.dim() == 2, "openblas_mm: operands must be 2-D float32 CPU tensors");
  GA_CHECK(c.dim() == 2, "openblas_mm: the result must be a contiguous float32 CPU tensor");
  GA_CHECK(a.size(1) == b.size(0) && c.size(0) == a.size(0) && c.size(1) == b.size(1),
           "openblas_mm: shapes [{}, {}] · [{}, {}] → [{}, {}] do not chain", a.size(0), a.size(1), b.size(0),
           b.size(1), c.size(0), c.size(1));
  GA_CHECK(c.is_contiguous() && c.scalar_type() == torch::kFloat && c.is_cpu(),
           "openblas_mm: the result must be a contiguous float32 CPU tensor");
  const int64_t m = a.size(0), n = b.size(1), k = a.size(1);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: BLAS would leave beta · C
    if (beta == 0.0f) c.zero_();
    return;
  }
  const auto oa = blas_operand(a), ob = blas_operand(b);
  GA_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && oa.ld <= INT_MAX && ob.ld <= INT_MAX,
           "openblas_mm: a dimension or row stride exceeds OpenBLAS's 32-bit interface");
  openblas_gemm(oa.transposed, ob.transposed, m, n, k, 1.0f, oa.storage.data_ptr<float>(), oa.ld,
                ob.storage.data_ptr<float>(), ob.ld, beta, c.data_ptr<float>(), std::max<int64_t>(1, n));
}

}  // namespace

bool openblas_gemm_available() { return openblas().sgemm != nullptr; }

const std::string& openblas_config() { return openblas().config; }

bool openblas_preferred() {
  static const bool preferred = openblas_gemm_available() && libtorch_blas_is_mkl() && !cpu_is_intel();
  return preferred;
}

void openblas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const auto sgemm = openblas().sgemm;
  GA_CHECK(sgemm != nullptr, "openblas_gemm: no OpenMP OpenBLAS was loaded");
  sgemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, static_cast<int>(m), static_cast<int>(n),
        static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

}  // namespace gradaccum::kernels

namespace gradaccum::kernels {

torch::Tensor openblas_mm(const torch::Tensor& a, const torch::Tensor& b) {
  GA_CHECK(a.dim() == 2 && b.dim() == 2, "openblas_mm: operands must be 2-D float32 CPU tensors");
  auto c = torch::empty({a.size(0), b.size(1)}, torch::dtype(torch::kFloat));
  product_into(c, a, b, 0.0f);
  return c;
}

void openblas_addmm_(torch::Tensor& c, const torch::Tensor& a, const torch::Tensor& b) { product_into(c, a, b, 1.0f); }

}  // namespace gradaccum::kernels
