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

#if (defined(__x86_64__) || defined(__i386__)) && defined(__clang__) && __clang_major__ < 16
// Clang before 16 knows neither "amx-bf16" nor "avx512fp16" in __builtin_cpu_supports (Debian 12's
// clang, which the fuzz build uses, is 14): read CPUID leaf 7 instead. Both bits need the OS's
// AVX-512 state, which XCR0 bits 5-7 (opmask, ZMM) report.
namespace {
bool cpuid7_bit(unsigned subleaf, int reg, int bit) {
  unsigned r[4] = {0, 0, 0, 0};
  if (__get_cpuid_count(7, subleaf, &r[0], &r[1], &r[2], &r[3]) == 0) return false;
  return ((r[reg] >> bit) & 1U) != 0;
}
bool os_saves_avx512_state() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || ((ecx >> 27) & 1U) == 0) return false;  // OSXSAVE
  unsigned xcr0 = 0, high = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0), "=d"(high) : "c"(0));  // XCR0 (no -mxsave needed)
  return (xcr0 & 0xe6) == 0xe6;
}
}  // namespace

bool cpu_has_native_bf16() {
  // AVX512_BF16: leaf 7.1 EAX bit 5; AMX-BF16: leaf 7.0 EDX bit 22.
  return os_saves_avx512_state() && (cpuid7_bit(1, 0, 5) || cpuid7_bit(0, 3, 22));
}

bool cpu_has_native_fp16() {
  return os_saves_avx512_state() && cpuid7_bit(0, 3, 23);  // AVX512_FP16: leaf 7.0 EDX bit 23
}
#else
bool cpu_has_native_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
#else
  return false;  // not known here: float32 GEMMs are the safe choice
#endif
}

bool cpu_has_native_fp16() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx512fp16");
#else
  return false;
#endif
}
#endif

bool libtorch_blas_is_mkl() {
  static const bool mkl = at::show_config().find("BLAS_INFO=mkl") != std::string::npos;
  return mkl;
}

}  // namespace gradaccum::kernels
