// kernels::FlushDenormalsScope: inside it a product whose exact value is below
// float's smallest normal number is 0, and a denormal input reads as 0; outside
// it (before, and after the scope restores the thread's state) both are IEEE's.
#include "gradaccum/kernels/flush_denormals.h"

#include <gtest/gtest.h>

#include <limits>
#include <thread>

namespace flush_denormals_test {

using gradaccum::kernels::FlushDenormalsScope;

// volatile: the products must happen at run time, under the thread's current mode.
float product(float a, float b) {
  volatile float x = a;
  volatile float y = b;
  return x * y;
}

TEST(FlushDenormalsScope, FlushesDenormalResultsAndInputsInsideOnly) {
#if !(defined(__x86_64__) || defined(_M_X64))
  GTEST_SKIP() << "the scope sets x86's MXCSR; on this architecture it does nothing";
#endif
  const float smallest_normal = std::numeric_limits<float>::min();  // 1.18e-38
  const float denormal = smallest_normal / 4.0f;                    // exact: 2^-128
  ASSERT_GT(denormal, 0.0f);
  EXPECT_EQ(product(smallest_normal, 0.25f), denormal);
  EXPECT_EQ(product(denormal, 4.0f), smallest_normal);
  {
    const FlushDenormalsScope flush;
    EXPECT_EQ(product(smallest_normal, 0.25f), 0.0f);  // the result is flushed
    EXPECT_EQ(product(denormal, 4.0f), 0.0f);          // the input reads as 0
    EXPECT_EQ(product(smallest_normal, 2.0f), 2.0f * smallest_normal);
    {
      const FlushDenormalsScope nested;
      EXPECT_EQ(product(smallest_normal, 0.25f), 0.0f);
    }
    EXPECT_EQ(product(smallest_normal, 0.25f), 0.0f);  // the inner scope restored the outer's mode
    // Another thread keeps its own mode.
    float elsewhere = -1.0f;
    std::thread([&] { elsewhere = product(smallest_normal, 0.25f); }).join();
    EXPECT_EQ(elsewhere, denormal);
  }
  EXPECT_EQ(product(smallest_normal, 0.25f), denormal);
  EXPECT_EQ(product(denormal, 4.0f), smallest_normal);
}

}  // namespace flush_denormals_test
