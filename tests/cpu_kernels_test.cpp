// The CPU kernel selection (io/blas_backend.h, io/aten_kernels.h): the table, the
// decision, and the switch itself in this process and in the gradaccum program.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

#include "gradaccum/io/aten_kernels.h"
#include "gradaccum/io/blas_backend.h"
#include "test_support.h"

namespace {

using gradaccum::io::better_openblas_kernels;
using gradaccum::io::IsaLevel;
using gradaccum::io::openblas_kernels_isa;

// `gradaccum --version` run with `variable` = `value` in its environment.
gradaccum::testing::CliResult version_with(const char* variable, const char* value) {
  EXPECT_EQ(setenv(variable, value, 1), 0);
  auto result = gradaccum::testing::run_cli("--version");
  unsetenv(variable);
  return result;
}

TEST(BlasBackend, KernelSetsAreRankedByTheirVectorInstructions) {
  EXPECT_EQ(openblas_kernels_isa("Prescott"), IsaLevel::sse);
  EXPECT_EQ(openblas_kernels_isa("Nehalem"), IsaLevel::sse);
  EXPECT_EQ(openblas_kernels_isa("Sandybridge"), IsaLevel::avx);
  EXPECT_EQ(openblas_kernels_isa("Haswell"), IsaLevel::avx2);
  EXPECT_EQ(openblas_kernels_isa("Zen"), IsaLevel::avx2);
  EXPECT_EQ(openblas_kernels_isa("SkylakeX"), IsaLevel::avx512);
  EXPECT_EQ(openblas_kernels_isa("skylakex"), IsaLevel::avx512);  // OPENBLAS_CORETYPE is case-blind
  EXPECT_EQ(openblas_kernels_isa("Cooperlake"), IsaLevel::avx512);
  EXPECT_EQ(openblas_kernels_isa("NeoverseN1"), IsaLevel::unknown);
  EXPECT_EQ(openblas_kernels_isa(""), IsaLevel::unknown);
}

TEST(BlasBackend, ForcesTheBestSetOnlyWhenTheDetectedOneIsKnownAndWeaker) {
  // The case this exists for: OpenBLAS 0.3.21 on a CPU model newer than itself.
  EXPECT_EQ(better_openblas_kernels("Prescott", IsaLevel::avx512), "SkylakeX");
  EXPECT_EQ(better_openblas_kernels("Haswell", IsaLevel::avx512), "SkylakeX");
  EXPECT_EQ(better_openblas_kernels("Prescott", IsaLevel::avx2), "Haswell");
  EXPECT_EQ(better_openblas_kernels("Nehalem", IsaLevel::avx), "Sandybridge");
  // Already as good: left alone (Zen is AMD's AVX2 set; Cooperlake adds bf16 to SkylakeX).
  EXPECT_EQ(better_openblas_kernels("SkylakeX", IsaLevel::avx512), std::nullopt);
  EXPECT_EQ(better_openblas_kernels("Cooperlake", IsaLevel::avx512), std::nullopt);
  EXPECT_EQ(better_openblas_kernels("Zen", IsaLevel::avx2), std::nullopt);
  EXPECT_EQ(better_openblas_kernels("SkylakeX", IsaLevel::avx2), std::nullopt);
  // Nothing better to offer, or a set this table does not know.
  EXPECT_EQ(better_openblas_kernels("Prescott", IsaLevel::sse), std::nullopt);
  EXPECT_EQ(better_openblas_kernels("Prescott", IsaLevel::unknown), std::nullopt);
  EXPECT_EQ(better_openblas_kernels("NeoverseN1", IsaLevel::avx512), std::nullopt);
}

TEST(BlasBackend, SelectionLeavesNoBetterKernelsUnusedAndGemmsStayCorrect) {
  const bool user_chose = std::getenv("OPENBLAS_CORETYPE") != nullptr;
  const auto& selection = gradaccum::io::select_blas_kernels();
  const auto info = gradaccum::io::probe_blas();
  ASSERT_EQ(info.kind.rfind("openblas", 0), 0u)
      << "scripts/setup.sh makes OpenBLAS the system BLAS; loaded: " << info.kind << " " << info.library;
  EXPECT_EQ(info.kernels, selection.active);
  EXPECT_FALSE(info.kernels.empty());
  if (user_chose) {
    EXPECT_NE(selection.reason.find("set by the user"), std::string::npos) << selection.reason;
  } else {
    // Whatever OpenBLAS detected, nothing this CPU could run better is left unused...
    EXPECT_EQ(better_openblas_kernels(selection.active, gradaccum::io::cpu_isa_level()), std::nullopt)
        << "detected " << selection.detected << ", active " << selection.active << ": "
        << selection.reason;
    // ...and the environment is as it was, so child processes decide for themselves.
    EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr);
  }
  // A second call returns the first call's decision (the switch happens once).
  EXPECT_EQ(&gradaccum::io::select_blas_kernels(), &selection);

  // The switched-to kernels compute the same products: odd sizes exercise every edge path.
  torch::manual_seed(0);
  const auto a = torch::randn({257, 193});
  const auto b = torch::randn({193, 515});
  const auto exact = a.to(torch::kDouble).mm(b.to(torch::kDouble));
  EXPECT_LT(gradaccum::testing::max_relative_difference(a.mm(b).to(torch::kDouble), exact), 1e-5);
  EXPECT_LT(gradaccum::testing::max_relative_difference(a.t().contiguous().t().mm(b).to(torch::kDouble), exact),
            1e-5);
  const auto bias = torch::randn({515});
  EXPECT_LT(gradaccum::testing::max_relative_difference(
                torch::addmm(bias, a, b).to(torch::kDouble), exact + bias.to(torch::kDouble)),
            1e-5);
}

// The program reports its BLAS, and the kernels it reports are the best this CPU runs.
TEST(BlasBackend, ProgramReportsAndUsesTheBestKernels) {
  ASSERT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr) << "run the tests without OPENBLAS_CORETYPE";
  const auto version = gradaccum::testing::run_cli("--version");
  ASSERT_EQ(version.exit_code, 0) << version.err;
  const std::string marker = "BLAS: openblas-openmp, ";
  const auto at = version.out.find(marker);
  ASSERT_NE(at, std::string::npos) << version.out;
  const auto begin = at + marker.size();
  const auto end = version.out.find(" kernels", begin);
  ASSERT_NE(end, std::string::npos) << version.out;
  const auto kernels = version.out.substr(begin, end - begin);
  EXPECT_NE(openblas_kernels_isa(kernels), IsaLevel::unknown) << version.out;
  EXPECT_EQ(better_openblas_kernels(kernels, gradaccum::io::cpu_isa_level()), std::nullopt) << version.out;

  // A user's OPENBLAS_CORETYPE wins, and is named as the reason.
  const auto forced = version_with("OPENBLAS_CORETYPE", "Haswell");
  ASSERT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_NE(forced.out.find("BLAS: openblas-openmp, Haswell kernels (OPENBLAS_CORETYPE=Haswell (set by the user))"),
            std::string::npos)
      << forced.out;
}

// ATen's AVX512 kernels on CPUs with AVX-512 and BF16 (io/aten_kernels.h), and the user's choice wins.
TEST(AtenKernels, ProgramUsesAvx512KernelsWhereTheCpuRunsThemAtFullClock) {
  ASSERT_EQ(std::getenv("ATEN_CPU_CAPABILITY"), nullptr) << "run the tests without ATEN_CPU_CAPABILITY";
  const auto version = gradaccum::testing::run_cli("--version");
  ASSERT_EQ(version.exit_code, 0) << version.err;
  const std::string expected = gradaccum::io::cpu_has_avx512_bf16() ? "ATen: AVX512 kernels (AVX-512 with BF16" : "ATen's default for this CPU";
  EXPECT_NE(version.out.find(expected), std::string::npos) << version.out;

  const auto forced = version_with("ATEN_CPU_CAPABILITY", "default");
  ASSERT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_NE(forced.out.find("ATen: DEFAULT kernels (ATEN_CPU_CAPABILITY=default (set by the user))"),
            std::string::npos)
      << forced.out;
}

// In a test process the environment set-up (test_support.cpp) made the same choice.
TEST(AtenKernels, SelectionIsMadeOnceAndReportsWhatAtenUses) {
  const auto& selection = gradaccum::io::select_aten_kernels();
  EXPECT_EQ(&gradaccum::io::select_aten_kernels(), &selection);
  EXPECT_EQ(selection.capability, gradaccum::io::aten_capability());
  EXPECT_FALSE(selection.capability.empty());
  EXPECT_EQ(std::getenv("ATEN_CPU_CAPABILITY"), nullptr);
  // Whatever the set, the kernels compute what float64 does.
  const auto x = torch::linspace(-6, 6, 1001);
  const auto gelu = torch::gelu(x, "tanh").to(torch::kDouble);
  EXPECT_LT(gradaccum::testing::max_relative_difference(gelu, torch::gelu(x.to(torch::kDouble), "tanh")), 1e-6);
  const auto softmax = torch::softmax(x.view({7, 143}), 1).to(torch::kDouble);
  EXPECT_LT(gradaccum::testing::max_relative_difference(softmax, torch::softmax(x.view({7, 143}).to(torch::kDouble), 1)),
            1e-6);
}

}  // namespace
