// 16-bit CPU autocast on CPUs without 16-bit dot-product instructions.
//
// libtorch multiplies bfloat16 and float16 matrices with oneDNN, which is fast
// only where the CPU multiplies that type itself (AVX512-BF16 or AMX-BF16 for
// bfloat16, AVX512-FP16 or AMX-FP16 for float16). Elsewhere its GEMM emulates
// them. Measured with torch 2.15 on one core of an AMD EPYC (AVX512-BF16, no
// AVX512-FP16), 1024³, the ISA capped through ONEDNN_MAX_CPU_ISA
// (bench/bf16_matmul_rates.py): bfloat16 193.7 GFLOP/s vs float32 82.8 with
// AVX512-BF16, 37.8 vs 89.8 with AVX-512 but no BF16, 0.9 vs 85.5 with AVX2;
// float16 2.5 vs 49 (512³). 16-bit hardware (AMX, AVX512-BF16/FP16, GPUs)
// multiplies 16-bit values and sums in float32.
//
// route_cpu_autocast_matmuls_through_float32() makes CPU autocast do that for the
// ops that it runs in 16 bits (linear, matmul, mm, addmm, bmm, baddbmm, conv1d,
// conv2d, scaled_dot_product_attention): each floating operand is rounded to
// autocast's dtype (bfloat16 or float16, whichever the region has) as autocast
// would, the op runs in float32 on those values, and the result is rounded to
// that dtype. Autograd records
// the casts, so the backward rounds the gradients to 16 bits where autocast's
// would be 16-bit (a float16 weight gradient overflows to inf or flushes to
// zero exactly there: what fp16's loss scaler exists for), and runs its
// products in float32 too. Results equal 16-bit hardware's up to the float32
// summation order. The linear keeps only its 16-bit input and a reference to
// the weight for the backward (which rounds the weight again), not float32
// copies of both: a float32 copy of every weight would live from a layer's
// forward to its backward.
//
// Why hand-written: PyTorch has no switch for this. The routing replaces those
// ops' AutocastCPU kernels in libtorch's dispatcher, process-wide and for the
// rest of the process (removing them could race with threads that dispatch);
// what they do is a process-wide switch: routed, or, switched off, what
// libtorch's own entries do (the operands cast to 16 bits through autocast's
// weight cache, the op run in 16 bits).
//
// This is the mechanism only. Whether a run routes depends on its mixed precision
// and the config key bf16_cpu_matmuls, which the process set-up decides
// (run/runtime.h, routes_cpu_matmuls_through_float32), from what the CPU multiplies
// itself (kernels/cpu_and_blas.h, cpu_has_native_bf16 and cpu_has_native_fp16).
#pragma once

namespace gradaccum::kernels {

// On: installs the routing (once per process) and routes. Off: libtorch's own
// path again. Affects only code that runs under CPU autocast (bfloat16 or
// float16). run::ProcessSetup sets it for a run and puts it back after.
void route_cpu_autocast_matmuls_through_float32(bool on = true);

// Whether CPU autocast's matmuls route through float32 now.
bool cpu_autocast_matmuls_route_through_float32();

}  // namespace gradaccum::kernels
