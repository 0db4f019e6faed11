#!/opt/gradaccum/venv/bin/python
"""16-bit CPU GEMM rates against float32, per instruction set: what decides
`bf16_cpu_matmuls: auto` and fp16's routing (kernels/float32_cpu_matmuls.h).

For each cap of oneDNN's instruction set (ONEDNN_MAX_CPU_ISA: none = what the CPU has,
AVX512_CORE = AVX-512 without BF16/FP16, AVX2) a child process on one thread times a
1024^3 product in float32, bfloat16 and float16 (median of 5 after one warm-up), and the
relative error of a [256, 8192] x [8192, 256] bfloat16 product against float64 sums of the
same bfloat16 inputs (float32 sums give ~2e-3: the result's own rounding).

  /opt/gradaccum/venv/bin/python bench/bf16_matmul_rates.py
"""
import json
import os
import subprocess
import sys

CHILD = r"""
import json, statistics, time, torch
torch.set_num_threads(1)
def rate(dtype, n=1024, reps=5):
    a = torch.randn(n, n).to(dtype); b = torch.randn(n, n).to(dtype)
    a @ b
    times = []
    for _ in range(reps):
        t = time.perf_counter(); a @ b; times.append(time.perf_counter() - t)
    return 2 * n ** 3 / statistics.median(times) / 1e9
a = torch.randn(256, 8192).bfloat16(); b = torch.randn(8192, 256).bfloat16()
exact = a.double() @ b.double()
err = ((a @ b).double() - exact).norm() / exact.norm()
print(json.dumps({"aten": torch.backends.cpu.get_cpu_capability(),
                  "float32": rate(torch.float32), "bfloat16": rate(torch.bfloat16),
                  "float16": rate(torch.float16), "bf16_relative_error": err.item()}))
"""


def main():
    print("| ONEDNN_MAX_CPU_ISA | float32 GFLOP/s | bfloat16 GFLOP/s | float16 GFLOP/s | bf16 rel. error (k = 8192) |")
    print("|---|---|---|---|---|")
    for cap in [None, "AVX512_CORE", "AVX2"]:
        env = dict(os.environ)
        if cap:
            env["ONEDNN_MAX_CPU_ISA"] = cap
        r = json.loads(subprocess.run([sys.executable, "-c", CHILD], env=env, check=True,
                                      capture_output=True, text=True).stdout)
        print(f"| {cap or 'unset (' + r['aten'] + ')'} | {r['float32']:.1f} | {r['bfloat16']:.1f} | "
              f"{r['float16']:.1f} | {r['bf16_relative_error']:.2e} |", flush=True)


if __name__ == "__main__":
    main()
