// How much freed memory the process keeps: a training loop frees and
// re-allocates the same activations every step, so memory handed back to the
// kernel at the end of a step is faulted back in (and zeroed) by the next one.
#pragma once

namespace gradaccum::kernels {

// glibc returns the free top of its heap to the kernel once it exceeds the
// trim threshold, and serves blocks above the mmap threshold (at most 32 MiB)
// with mmap/munmap: each such block is faulted in and zeroed page by page every
// time it is allocated. On the default CNN at b = 64 (6.4 MB activations)
// `gradaccum train` had its heap trimmed during every step and 6,000-13,000
// pages (25-55 MB) faulted back in per 64-sample step; GPT-2 small's LM head
// allocates ~260 MB of such blocks per micro-step (its logits chunks and the
// table's gradient): ~82,000 page faults, and 2.3 s of kernel time per
// optimizer step (docs/benchmarks-history.md, "Page faults"). This serves every
// block from the heap (M_MMAP_MAX = 0) and keeps up to 1 GiB of free heap top,
// so freed blocks are reused in place. The cost is fragmentation: freed large
// blocks stay resident between uses, and GPT-2 small's peak RSS grows by
// ~120 MB (4.3%). Measured on libtorch 2.15 against the engine without it
// (bench/custom_kernels.py): GPT-2 small's shape +8.5% tokens/s;
// with the earlier thresholds (32 MiB mmap, 64 MiB trim) the CNN at 64x1
// trained 28% faster, seed 000's MLP 69%, the GPT benchmark 17%.
//
// Does it where custom_kernels has heap_retention (kernels/custom_kernels.h) and
// the C library is glibc, and returns whether it did. Process-wide: call once at
// program start, after the switch is set.
bool retain_freed_heap();

}  // namespace gradaccum::kernels
