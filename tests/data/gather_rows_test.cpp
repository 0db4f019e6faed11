// data::gather_rows against index_select, and its error for a bad index.
#include "gradaccum/data/gather_rows.h"

#include <gtest/gtest.h>

#include <string>

#include "gradaccum/base/check.h"

namespace gather_rows_test {

using gradaccum::data::gather_rows;

TEST(GatherRows, EqualsIndexSelectForEveryDtypeAndShape) {
  torch::manual_seed(1);
  const auto indices = torch::tensor({4, 0, 4, 2}, torch::kLong);
  const std::vector<torch::Tensor> sources = {torch::randn({5, 16}), torch::randn({5, 1, 3, 3}, torch::kDouble),
                                              torch::randint(0, 255, {5, 1, 28, 28}).to(torch::kUInt8),
                                              torch::arange(5, torch::kLong)};
  for (const auto& source : sources) {
    const auto got = gather_rows(source, indices);
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_EQ(got.scalar_type(), source.scalar_type());
    EXPECT_TRUE(torch::equal(got, source.index_select(0, indices))) << source.sizes();
  }
  // No rows, and a non-contiguous source (the index_select path).
  EXPECT_EQ(gather_rows(sources[0], torch::empty({0}, torch::kLong)).sizes(), (std::vector<int64_t>{0, 16}));
  const auto transposed = torch::randn({16, 5}).t();
  EXPECT_TRUE(torch::equal(gather_rows(transposed, indices), transposed.index_select(0, indices)));
}

TEST(GatherRows, AnIndexOutOfRangeIsAnErrorNamingIt) {
  const auto source = torch::randn({3, 2});
  try {
    gather_rows(source, torch::tensor({1, 3}, torch::kLong));
    FAIL() << "expected an error";
  } catch (const gradaccum::Error& e) {
    EXPECT_EQ(std::string(e.what()), "sample index 3 out of range [0, 3)");
  }
  EXPECT_THROW(gather_rows(source, torch::tensor({-1}, torch::kLong)), gradaccum::Error);
}

}  // namespace gather_rows_test
