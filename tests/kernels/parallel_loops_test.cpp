// The library's own at::parallel_for loops use the threads they are given
// (kernels/parallel_loops.h): they run on one thread when the library is compiled
// without OpenMP, which nothing else would notice.
#include "gradaccum/kernels/parallel_loops.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

namespace parallel_loops_test {

TEST(ParallelLoops, LibraryLoopsRunOnEveryThreadTheyAreGiven) {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  EXPECT_EQ(gradaccum::kernels::parallel_loop_threads(8), 2);
  at::set_num_threads(1);
  EXPECT_EQ(gradaccum::kernels::parallel_loop_threads(8), 1);
  at::set_num_threads(threads);
}

}  // namespace parallel_loops_test
