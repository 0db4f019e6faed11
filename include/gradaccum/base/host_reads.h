// Host reads of tensor values (item(), nonzero(), any data-dependent shape)
// on the training path.
//
// On an accelerator, reading a value computed on the device makes the host wait
// for the device to finish everything queued so far: one such read per
// micro-step removes the overlap of host and device that keeps a GPU busy. The
// engine therefore reads values once per optimizer step (the step's metrics,
// core/step_record.cpp) and nowhere else; the micro-step path never does. Models and
// losses may still check their inputs or compact their work by reading values
// when their tensors are on the CPU, where a read costs nothing; such code runs
// inside GRADACCUM_CPU_HOST_READ_SCOPE(), a named RecordFunction range that
// tests/base/host_reads_test.cpp (and a profiler trace) tells apart from a read that
// would stall a GPU.
#pragma once

#include <ATen/record_function.h>

namespace gradaccum::base {

// The name of the range GRADACCUM_CPU_HOST_READ_SCOPE() opens.
inline constexpr const char* kCpuHostReadScope = "gradaccum::cpu_host_read";

}  // namespace gradaccum::base

// Opens, until the end of the enclosing block, the range in which host reads
// of CPU tensors are expected. Use it only under a check that the tensors read
// are on the CPU. Costs one thread-local check when nothing observes it.
#define GRADACCUM_CPU_HOST_READ_SCOPE() RECORD_USER_SCOPE(::gradaccum::base::kCpuHostReadScope)
