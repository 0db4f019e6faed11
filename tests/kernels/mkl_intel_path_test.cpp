// kernels/mkl_intel_path.h: MKL's vendor checks reach libgradaccum's answers;
// on a CPU that is not Intel's, MKL takes its Intel code while mkl_intel_path
// is on at its first GEMM and keeps its own choice otherwise; the products it
// computes then agree with float64 (float32) and with the same product formed
// the other way round (float64).
#include "gradaccum/kernels/mkl_intel_path.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gradaccum/kernels/cpu_and_blas.h"
#include "gradaccum/kernels/custom_kernels.h"
#include "test_support.h"

namespace mkl_intel_path_test {

using namespace gradaccum;
using gradaccum::testing::CustomKernelsScope;

// One GEMM large enough that libtorch hands it to its BLAS.
void first_gemm() {
  const auto a = torch::randn({256, 256});
  ASSERT_EQ(torch::mm(a, a).size(0), 256);
}

TEST(MklIntelPath, MklsVendorChecksResolveToLibgradaccum) {
  for (const char* name : {"mkl_serv_intel_cpu_true", "mkl_serv_intel_cpu"}) {
    void* reached = dlsym(RTLD_DEFAULT, name);
    ASSERT_NE(reached, nullptr) << name;
    Dl_info ours{}, found{};
    ASSERT_NE(dladdr(reinterpret_cast<void*>(&kernels::mkl_intel_path_active), &ours), 0);
    ASSERT_NE(dladdr(reached, &found), 0);
    EXPECT_STREQ(found.dli_fname, ours.dli_fname) << name;
  }
}

TEST(MklIntelPath, OnAtTheFirstGemmOnOtherVendorsCpusWithMkl) {
  if (kernels::mkl_intel_path_decided())
    GTEST_SKIP() << "MKL already asked in this process (ctest runs each test alone)";
  first_gemm();
  const bool applies = kernels::libtorch_blas_is_mkl() && !kernels::cpu_is_intel();
  if (applies) EXPECT_TRUE(kernels::mkl_intel_path_decided());
  EXPECT_EQ(kernels::mkl_intel_path_active(), applies);
  EXPECT_EQ(kernels::mkl_intel_path_description().empty(), !applies);
  // Fixed for the process once MKL has asked: turning the kernel off now changes nothing.
  CustomKernelsScope off("none");
  EXPECT_EQ(kernels::mkl_intel_path_active(), applies);
}

TEST(MklIntelPath, OffAtTheFirstGemmLeavesMklItsOwnChoice) {
  if (kernels::mkl_intel_path_decided())
    GTEST_SKIP() << "MKL already asked in this process (ctest runs each test alone)";
  CustomKernelsScope off(kernels::custom_kernels_without(kernels::CustomKernel::mkl_intel_path));
  first_gemm();
  EXPECT_FALSE(kernels::mkl_intel_path_active());
  EXPECT_EQ(kernels::mkl_intel_path_description(), "");
}

TEST(MklIntelPath, ProductsAgreeWithFloat64) {
  torch::manual_seed(11);
  // A transformer block's products at 510 tokens of width 768, and the LM head's.
  for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {510, 2304, 768}, {510, 768, 3072}, {768, 3072, 510}, {333, 8192, 192}}) {
    const auto a = torch::randn({m, k}, torch::kDouble), b = torch::randn({k, n}, torch::kDouble);
    const auto exact = torch::mm(a, b);
    const auto transposed = torch::mm(b.t(), a.t()).t();
    EXPECT_LT((transposed - exact).abs().max().item<double>() / exact.abs().max().item<double>(), 1e-13);
    const auto single = torch::mm(a.to(torch::kFloat), b.to(torch::kFloat)).to(torch::kDouble);
    EXPECT_LT((single - exact).abs().max().item<double>() / exact.abs().max().item<double>(), 1e-5)
        << m << " x " << n << " x " << k;
  }
}

}  // namespace mkl_intel_path_test
