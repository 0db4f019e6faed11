// run::retain_freed_heap: a block of activation size is served from the heap
// and stays there after free, instead of being mmapped or trimmed (which the
// next training step would fault back in).
#include "gradaccum/run/heap_retention.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace heap_retention_test {

// Keeps the compiler from eliding a malloc/free pair whose block is never read.
void escape(void* p) { asm volatile("" : : "g"(p) : "memory"); }

TEST(HeapRetention, ActivationSizedBlockComesFromTheHeapAndIsNotTrimmed) {
  ASSERT_TRUE(gradaccum::run::retain_freed_heap());
  // The default CNN's largest activation at b = 64 is 6.4 MB; by default glibc
  // mmaps blocks above 128 KiB until its dynamic threshold has grown.
  constexpr size_t kBytes = 24u << 20;
  const auto before = mallinfo2();
  auto* block = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);
  escape(block);
  const auto held = mallinfo2();
  EXPECT_EQ(held.hblkhd, before.hblkhd) << "the block was mmapped";
  EXPECT_GE(held.uordblks, before.uordblks + kBytes) << "the block is not in the heap";
  std::free(block);
  escape(block);
  const auto after = mallinfo2();
  EXPECT_EQ(after.arena, held.arena) << "the heap was trimmed: " << held.arena - after.arena
                                     << " bytes returned to the kernel";
}

}  // namespace heap_retention_test
