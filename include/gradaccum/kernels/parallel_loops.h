// How many threads this library's own parallel loops run on.
//
// at::parallel_for is a header template: its `#pragma omp parallel` is
// compiled into the calling file, so a library built without OpenMP runs
// every at::parallel_for of its own on one thread, silently, while libtorch's
// operators still use all threads. CMakeLists.txt links OpenMP for that
// reason; tests/kernels/parallel_loops_test.cpp checks that it took effect.
#pragma once

#include <cstdint>

namespace gradaccum::kernels {

// The number of distinct threads an at::parallel_for over `tasks` tasks of
// grain 1, compiled into this library, runs on at the current
// at::get_num_threads(): min(tasks, threads) when OpenMP is in effect, 1 when not.
int64_t parallel_loop_threads(int64_t tasks);

}  // namespace gradaccum::kernels
