// kernels/openblas_gemm.h: Debian's OpenMP OpenBLAS loads where setup installed
// it, its products equal libtorch's to float32 rounding in every operand layout
// the LM head uses, and bad operands are one-line errors.
#include "gradaccum/kernels/openblas_gemm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "test_support.h"

namespace openblas_gemm_test {

using namespace gradaccum;
using gradaccum::testing::max_relative_difference;

#if defined(__x86_64__)
constexpr const char* kDebianOpenmpBuild = "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0";
#else
constexpr const char* kDebianOpenmpBuild = "/usr/lib/aarch64-linux-gnu/openblas-openmp/libopenblas.so.0";
#endif

TEST(OpenblasGemm, DebiansOpenmpBuildLoadsWhereInstalled) {
  if (!std::filesystem::exists(kDebianOpenmpBuild)) {
    GTEST_SKIP() << kDebianOpenmpBuild << " is not installed (scripts/setup.sh installs libopenblas0-openmp)";
  }
  ASSERT_TRUE(kernels::openblas_gemm_available());
  EXPECT_NE(kernels::openblas_config().find("USE_OPENMP"), std::string::npos) << kernels::openblas_config();
  std::printf("[ measured ] %s\n", kernels::openblas_config().c_str());
}

// a · b in float64, rounded: the reference for float32 products.
torch::Tensor reference(const torch::Tensor& a, const torch::Tensor& b) {
  return a.to(torch::kDouble).mm(b.to(torch::kDouble));
}

TEST(OpenblasGemm, ProductsEqualLibtorchsInEveryOperandLayout) {
  if (!kernels::openblas_gemm_available()) GTEST_SKIP() << "no OpenMP OpenBLAS loaded (libopenblas0-openmp)";
  auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
  const int64_t m = 37, n = 301, k = 29;
  const auto a = torch::randn({m, k}, generator);
  const auto b = torch::randn({k, n}, generator);
  // Each operand as stored row-major, as the transposed view of a row-major matrix (the head's
  // weight.t()), as a row slice of a wider matrix (row stride > columns), and with a column
  // step (neither: copied first).
  const auto wide_a = torch::randn({m, k + 5}, generator);
  wide_a.slice(1, 0, k).copy_(a);
  const auto stepped_b = torch::randn({k, 2 * n}, generator);
  stepped_b.slice(1, 0, 2 * n, 2).copy_(b);
  const std::pair<const char*, torch::Tensor> as[] = {
      {"row-major", a}, {"transposed", a.t().contiguous().t()}, {"row slice", wide_a.slice(1, 0, k)}};
  const std::pair<const char*, torch::Tensor> bs[] = {
      {"row-major", b}, {"transposed", b.t().contiguous().t()}, {"column step", stepped_b.slice(1, 0, 2 * n, 2)}};
  const auto expected = reference(a, b);
  for (const auto& [a_name, a_op] : as) {
    for (const auto& [b_name, b_op] : bs) {
      SCOPED_TRACE(std::string("a ") + a_name + ", b " + b_name);
      const auto product = kernels::openblas_mm(a_op, b_op);
      ASSERT_EQ(product.sizes(), torch::IntArrayRef({m, n}));
      EXPECT_TRUE(product.is_contiguous());
      EXPECT_LE(max_relative_difference(product.to(torch::kDouble), expected), 1e-5);
      EXPECT_LE(max_relative_difference(product, torch::mm(a_op, b_op)), 1e-5);
      // addmm_ adds into what is there.
      auto sum = torch::randn({m, n}, generator);
      const auto before = sum.to(torch::kDouble);
      kernels::openblas_addmm_(sum, a_op, b_op);
      EXPECT_LE(max_relative_difference(sum.to(torch::kDouble), before + expected), 1e-5);
    }
  }
  // An empty inner dimension: the product is zero, a sum is left as it was.
  const auto empty_product = kernels::openblas_mm(torch::ones({3, 0}), torch::ones({0, 4}));
  EXPECT_EQ(empty_product.abs().max().item<float>(), 0.0f);
  auto kept = torch::full({3, 4}, 2.0f);
  kernels::openblas_addmm_(kept, torch::ones({3, 0}), torch::ones({0, 4}));
  EXPECT_EQ(kept.min().item<float>(), 2.0f);
}

// OpenBLAS reserves 128 MiB per thread as it loads and retries a failed reservation forever:
// under an address-space limit a process that loaded it would hang (as `gradaccum --version`
// did under `ulimit -v 700000` before the rule). There it is not loaded, and the program runs.
TEST(OpenblasGemm, NotLoadedUnderAnAddressSpaceLimit) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "built with AddressSanitizer, whose shadow memory cannot start under any address-space limit";
#endif
  if (!kernels::openblas_gemm_available()) GTEST_SKIP() << "no OpenMP OpenBLAS loaded (libopenblas0-openmp)";
  const auto limited = gradaccum::testing::run_cli("--version", "", "ulimit -v 700000");
  ASSERT_EQ(limited.exit_code, 0) << limited.err;
  EXPECT_NE(limited.out.find("kernels: BLAS"), std::string::npos) << limited.out;
  EXPECT_EQ(limited.out.find("OpenBLAS"), std::string::npos) << limited.out;
  if (kernels::openblas_preferred()) {
    const auto unlimited = gradaccum::testing::run_cli("--version");
    ASSERT_EQ(unlimited.exit_code, 0) << unlimited.err;
    EXPECT_NE(unlimited.out.find("float32 LM head GEMMs: OpenBLAS"), std::string::npos) << unlimited.out;
  }
}

TEST(OpenblasGemm, BadOperandsAreOneLineErrors) {
  if (!kernels::openblas_gemm_available()) GTEST_SKIP() << "no OpenMP OpenBLAS loaded (libopenblas0-openmp)";
  EXPECT_ONE_LINE_ERROR(kernels::openblas_mm(torch::ones({2, 3}), torch::ones({4, 5})),
                        "openblas_mm: shapes [2, 3] · [4, 5] → [2, 5] do not chain");
  EXPECT_ONE_LINE_ERROR(kernels::openblas_mm(torch::ones({2, 3}, torch::kDouble), torch::ones({3, 5})),
                        "openblas_mm: operands must be 2-D float32 CPU tensors");
  EXPECT_ONE_LINE_ERROR(kernels::openblas_mm(torch::ones({2, 3, 1}), torch::ones({3, 5})),
                        "openblas_mm: operands must be 2-D float32 CPU tensors");
  auto strided = torch::zeros({5, 4}).t();
  EXPECT_ONE_LINE_ERROR(kernels::openblas_addmm_(strided, torch::ones({4, 3}), torch::ones({3, 5})),
                        "openblas_mm: the result must be a contiguous float32 CPU tensor");
}

}  // namespace openblas_gemm_test
