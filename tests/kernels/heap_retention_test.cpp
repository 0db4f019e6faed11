// kernels::retain_freed_heap: blocks of activation size and of GPT-2 small's table
// gradient are served from the heap and stay there after free, instead of being
// mmapped or trimmed (which the next micro-step would fault back in).
#include "gradaccum/kernels/heap_retention.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include "gradaccum/kernels/custom_kernels.h"
#include "test_support.h"

namespace heap_retention_test {

// Keeps the compiler from eliding a malloc/free pair whose block is never read.
void escape(void* p) { asm volatile("" : : "g"(p) : "memory"); }

TEST(HeapRetention, BlocksComeFromTheHeapAndAreNotTrimmed) {
  ASSERT_TRUE(gradaccum::kernels::retain_freed_heap());
  // The default CNN's largest activation at b = 64 is 6.4 MB; by default glibc
  // mmaps blocks above 128 KiB until its dynamic threshold has grown, and blocks
  // of 32 MiB and more always. GPT-2 small's tied table gradient is 154 MB.
  for (const size_t bytes : {size_t{24} << 20, size_t{160} << 20}) {
    const auto before = mallinfo2();
    auto* block = static_cast<char*>(std::malloc(bytes));
    ASSERT_NE(block, nullptr);
    std::memset(block, 1, bytes);
    escape(block);
    const auto held = mallinfo2();
    EXPECT_EQ(held.hblkhd, before.hblkhd) << bytes << " bytes: the block was mmapped";
    EXPECT_GE(held.uordblks, before.uordblks + bytes) << bytes << " bytes: the block is not in the heap";
    std::free(block);
    escape(block);
    const auto after = mallinfo2();
    EXPECT_EQ(after.arena, held.arena) << bytes << " bytes: the heap was trimmed: " << held.arena - after.arena
                                       << " bytes returned to the kernel";
  }
}

// Like every kernel it follows the switch: off, it leaves glibc's settings alone and says so.
TEST(HeapRetention, OffTheSwitchItLeavesTheHeapAlone) {
  using namespace gradaccum::kernels;
  const gradaccum::testing::CustomKernelsScope off(custom_kernels_without(CustomKernel::heap_retention));
  EXPECT_FALSE(retain_freed_heap());
}

}  // namespace heap_retention_test
