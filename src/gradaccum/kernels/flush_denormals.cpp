#include "gradaccum/kernels/flush_denormals.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#define GRADACCUM_HAS_MXCSR 1
#endif

namespace gradaccum::kernels {

#ifdef GRADACCUM_HAS_MXCSR
namespace {
constexpr unsigned int kFlushToZero = 0x8000;       // MXCSR bit 15: denormal results become 0
constexpr unsigned int kDenormalsAreZero = 0x0040;  // MXCSR bit 6: denormal inputs read as 0
}  // namespace

FlushDenormalsScope::FlushDenormalsScope() : saved_(_mm_getcsr()) {
  _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero);
}

FlushDenormalsScope::~FlushDenormalsScope() { _mm_setcsr(saved_); }
#else
FlushDenormalsScope::FlushDenormalsScope() = default;
FlushDenormalsScope::~FlushDenormalsScope() = default;
#endif

}  // namespace gradaccum::kernels
