// How much freed memory the process keeps: a training loop frees and
// re-allocates the same activations every step, so memory handed back to the
// kernel at the end of a step is faulted back in (and zeroed) by the next one.
#pragma once

namespace gradaccum::run {

// glibc returns the free top of its heap to the kernel once it exceeds the
// trim threshold, and serves blocks above the mmap threshold with mmap/munmap.
// Its dynamic rule raises both as larger blocks are freed, up to 32 MiB (mmap)
// and 64 MiB (trim), but only as far as the largest mmapped block freed so far.
// On the default CNN at b = 64 (6.4 MB activations) `gradaccum train` was left
// below that: its heap was trimmed during every step and 6,000-13,000 pages
// (25-55 MB) were faulted back in per 64-sample step (BENCHMARKS.md 1). This
// sets the rule's end state at once: blocks up to 32 MiB come from the heap,
// and up to 64 MiB of free heap top is kept. Peak RSS stays within a few MB
// (the pages are kept, not added). Returns false (and does nothing) off glibc.
// Process-wide: call once at program start. Still measured on libtorch 2.15
// (custom_kernels without heap_retention, bench/custom_kernels.py): the CNN at
// 64x1 trains 28% faster with it, seed 000's MLP 69%, the GPT benchmark 17%.
bool retain_freed_heap();

}  // namespace gradaccum::run
