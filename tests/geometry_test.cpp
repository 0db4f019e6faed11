#include <gtest/gtest.h>

#include "gradaccum/core/batch_geometry.h"
#include "gradaccum/core/check.h"

using gradaccum::core::BatchGeometry;

TEST(BatchGeometry, ProductAndDerivation) {
  auto g = BatchGeometry::from_accumulation(16, 4, 2);
  EXPECT_EQ(g.global_batch(), 128);
  EXPECT_EQ(g.samples_per_micro_step(), 32);
  auto d = BatchGeometry::from_global(16, 128, 2);
  EXPECT_EQ(d.accumulation_steps(), 4);
}
