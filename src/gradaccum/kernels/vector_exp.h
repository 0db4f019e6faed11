// What the CPU row kernels share: e^x for x ≤ 0 in float32, written so that the
// compiler vectorizes the loops that call it; the attribute that compiles such
// loops for AVX-512, AVX2 and the baseline; the lane count of their reductions;
// and the widening of their elements to float32. Used by the CPU kernels of the
// LM-head loss (softmax_cross_entropy.cpp), attention (qkv_attention.cpp) and
// GELU (gelu_tanh.cpp).
//
// Why hand-written: libtorch's vectorized exp (ATen's Vectorized<float>::exp,
// Sleef) exists only inside ATen's own per-ISA kernels; from outside, a loop
// calling std::exp is scalar, ~10x slower than this.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

// The loops are compiled for AVX-512, AVX2 and the baseline, and the loader
// picks the best the CPU has (GCC's function multiversioning): the library is
// built for any x86-64, and a baseline SSE2 loop is ~4x slower here. Files
// that use it compile with -fno-trapping-math (CMakeLists.txt): without it only
// the AVX-512 clones vectorize (tests/check_vector_clones.sh checks the AVX2 ones).
#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define GRADACCUM_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
#endif
#ifndef GRADACCUM_VECTOR_CLONES
#define GRADACCUM_VECTOR_CLONES
#endif

namespace gradaccum::kernels {

// Independent accumulators per pass of a row kernel, so that the compiler may
// vectorize a maximum or a sum without reordering one float sum (which it must not).
constexpr int kVectorLanes = 16;

// An element in float32 arithmetic: the row kernels read float32 and bfloat16 alike.
inline __attribute__((always_inline)) float to_float(float x) { return x; }
inline __attribute__((always_inline)) float to_float(c10::BFloat16 x) { return static_cast<float>(x); }

// Cephes' expf: x = n·ln 2 + r with |r| ≤ ln 2 / 2, a degree-6 polynomial for
// e^r, and 2^n built in the exponent bits; no libm call and no branch. Within
// ~1 ulp of std::exp. x is clamped at −87, so the result is at least
// e^−87 ≈ 1.6e-38, a normal float, where the exact value would underflow:
// callers add it to sums ≥ 1, where it is below any rounding.
inline __attribute__((always_inline)) float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  // Round x·log2(e) to the nearest integer by adding and subtracting 1.5·2^23.
  constexpr float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;  // ln 2 in two parts: the high part is exact in float
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e_r = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_to_n;
  std::memcpy(&two_to_n, &bits, sizeof two_to_n);
  return e_r * two_to_n;
}

}  // namespace gradaccum::kernels
