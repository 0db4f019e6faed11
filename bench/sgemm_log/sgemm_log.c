// An LD_PRELOAD shim that logs every single-precision GEMM a process asks the
// system BLAS for: transposes, m, n, k, alpha, beta, seconds, start time.
// It found that the C++ frontend's Linear ran its GEMMs with beta = 0
// (models/linear.h). Diagnostic only; nothing in the build uses it.
//
//   gcc -O2 -shared -fPIC bench/sgemm_log/sgemm_log.c -o /tmp/sgemm_log.so -ldl -lpthread
//   SGEMM_LOG=/tmp/sgemm.txt LD_PRELOAD=/tmp/sgemm_log.so build/bench/lm_throughput --steps 8
//   /opt/gradaccum/venv/bin/python bench/sgemm_log/summarize.py /tmp/sgemm.txt
//
// libtorch calls the Fortran symbol sgemm_ of libblas.so.3 (column-major
// arguments: a row-major y = x·Wᵀ is "TN" with m = out, n = rows, k = in).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void (*sgemm_fn)(const char*, const char*, const int*, const int*, const int*,
                         const float*, const float*, const int*, const float*, const int*,
                         const float*, float*, const int*);

static sgemm_fn real_sgemm;
static FILE* log_file;
static pthread_once_t loaded = PTHREAD_ONCE_INIT;

// Once per process: kernels such as attention's call sgemm_ from several
// OpenMP threads at once, and the log must be opened only once.
static void load(void) {
  real_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "sgemm_");
  const char* path = getenv("SGEMM_LOG");
  log_file = fopen(path != NULL ? path : "/dev/stderr", "w");
  if (real_sgemm == NULL || log_file == NULL) {
    fprintf(stderr, "sgemm_log: no sgemm_ after this library, or SGEMM_LOG not writable\n");
    abort();
  }
}

static double seconds_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc) {
  pthread_once(&loaded, load);
  const double start = seconds_now();
  real_sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  fprintf(log_file, "%c%c %d %d %d %g %g %.6f %.6f\n", *transa, *transb, *m, *n, *k, *alpha,
          *beta, seconds_now() - start, start);
}
