// The dtypes a numerical test runs in, each with the tolerance it is held to (as CTranslate2's
// tests pair device, dtype and tolerance): float64 shows that the arithmetic is exact up to
// rounding, float32 that it holds at the precision people train in.
//
//   class GeluMlpDtypes : public ::testing::TestWithParam<DtypeCase> {};
//   TEST_P(GeluMlpDtypes, FusedPathEqualsLibtorchLayers) { check(GetParam().dtype, GetParam().tolerance); }
//   INSTANTIATE_TEST_SUITE_P(, GeluMlpDtypes, dtype_cases(1e-12, 1e-5), dtype_case_name);
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace gradaccum::testing {

struct DtypeCase {
  torch::ScalarType dtype;
  double tolerance;  // the largest relative difference accepted
  const char* name;  // the test name's suffix
};

inline auto dtype_cases(double float64_tolerance, double float32_tolerance) {
  return ::testing::Values(DtypeCase{torch::kDouble, float64_tolerance, "Float64"},
                           DtypeCase{torch::kFloat, float32_tolerance, "Float32"});
}

inline std::string dtype_case_name(const ::testing::TestParamInfo<DtypeCase>& info) { return info.param.name; }

}  // namespace gradaccum::testing
