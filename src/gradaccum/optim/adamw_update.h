// The element-wise AdamW update of one contiguous range, the loop inside
// FusedAdamW (optim/fused_adamw.h). Its own translation unit, free of torch
// headers, because it is compiled with -fno-math-errno (CMakeLists.txt): sqrt
// may then skip setting errno, which is what lets the compiler vectorize it.
#pragma once

#include <cstdint>

namespace gradaccum::optim {

// The scalars of one parameter's update at its step t.
struct AdamWCoefficients {
  double decay;       // 1 − lr·λ
  double beta1, beta2;
  double step_size;   // lr / (1 − β₁ᵗ)
  double root_bias2;  // √(1 − β₂ᵗ)
  double eps;
};

// For i in [begin, end), in T throughout (as libtorch's float kernels compute):
//   p ← p·decay;  m ← β₁m + (1 − β₁)g;  v ← β₂v + (1 − β₂)g²;
//   p ← p − step_size · m / (√v / root_bias2 + eps)
// with subnormal results flushed to zero (see the .cpp). T is float or double.
template <typename T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t begin, int64_t end, const AdamWCoefficients& c);

}  // namespace gradaccum::optim
