// For the peers of a benchmark only: the answer libgradaccum gives MKL's vendor
// checks while the custom kernel mkl_intel_path is on (kernels/mkl_intel_path.h),
// loaded into a Python peer with LD_PRELOAD so that both sides of a comparison
// run MKL's same code (bench/cpu_kernels.py does this where gradaccum reports
// the path).
extern "C" int mkl_serv_intel_cpu_true() { return 1; }
extern "C" int mkl_serv_intel_cpu() { return 1; }
