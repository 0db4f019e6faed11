#include "gradaccum/kernels/cpu_and_blas.h"

#include <ATen/ATen.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cstring>

namespace gradaccum::kernels {

const std::string& cpu_vendor() {
  static const std::string vendor = [] {
#if defined(__x86_64__) || defined(__i386__)
    unsigned int max_leaf = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid(0, &max_leaf, &ebx, &ecx, &edx) == 0) return std::string();
    char name[13] = {};
    std::memcpy(name, &ebx, 4);
    std::memcpy(name + 4, &edx, 4);
    std::memcpy(name + 8, &ecx, 4);
    return std::string(name);
#else
    return std::string();
#endif
  }();
  return vendor;
}

bool cpu_is_intel() { return cpu_vendor() == "GenuineIntel"; }

bool libtorch_blas_is_mkl() {
  static const bool mkl = at::show_config().find("BLAS_INFO=mkl") != std::string::npos;
  return mkl;
}

}  // namespace gradaccum::kernels
