// A scope in which the calling thread's floating-point unit treats denormal
// (subnormal) numbers as zero, inputs and results alike.
//
// Why: on x86 an instruction that reads or produces a denormal takes a
// microcode assist, ~100 times its usual cost. Softmax rows with a wide range
// of scores (BLOOM's ALiBi bias adds up to slope × 511 to the last key's score)
// hold many probabilities below float's smallest normal 1.2e-38, and every
// product over them (p · v, pᵀ · dy, the softmax gradient) then runs at the
// assists' pace: kernels/qkv_attention's fused node took 2.5 times libtorch's
// attention at BLOOM-560m's shape before it flushed them (bench/attention_ab).
// What a flush changes is below 1.2e-38 of the values it is summed with.
//
// x86: sets MXCSR's flush-to-zero and denormals-are-zero bits and restores the
// previous MXCSR when the scope ends. Elsewhere it does nothing. It affects the
// calling thread only: open one inside each task of a parallel loop.
#pragma once

namespace gradaccum::kernels {

class FlushDenormalsScope {
 public:
  FlushDenormalsScope();
  ~FlushDenormalsScope();
  FlushDenormalsScope(const FlushDenormalsScope&) = delete;
  FlushDenormalsScope& operator=(const FlushDenormalsScope&) = delete;

 private:
  unsigned int saved_ = 0;
};

}  // namespace gradaccum::kernels
