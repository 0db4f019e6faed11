// scripts/soak.sh, short: a two-rank run interrupted by seeded SIGTERMs and SIGKILLs to the
// launcher or a rank, restarted each time with resume_from_checkpoint=auto, ends with the
// uninterrupted run's weights byte for byte (the long soak's result is in docs/robustness.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace soak_test {

TEST(Soak, FaultsAtRandomMomentsLeaveTheFinalWeightsBitIdentical) {
  const auto dir = gradaccum::testing::make_temp_dir("soak");
  const std::string command = std::string("bash ") + GRADACCUM_SOURCE_DIR +
                              "/scripts/soak.sh --steps 30 --faults 4 --seed 5 --out " + dir + " --gradaccum " +
                              GRADACCUM_CLI + " > " + dir + "/result.json 2> " + dir + "/soak.err";
  ASSERT_EQ(std::system(command.c_str()), 0) << gradaccum::testing::read_text(dir + "/soak.err");
  const auto result = nlohmann::json::parse(gradaccum::testing::read_text(dir + "/result.json"));
  EXPECT_EQ(result["faults"], 4) << result;
  EXPECT_EQ(result["kinds"].size(), 4u) << result;
  EXPECT_GE(result["attempts"].get<int>(), 5) << result;
  EXPECT_GE(result["steps_redone"].get<int>(), 0) << result;
  EXPECT_TRUE(result["identical"].get<bool>()) << result;
  EXPECT_EQ(gradaccum::testing::step_records(dir + "/soak/metrics.jsonl").size(), 30u);
  std::filesystem::remove_all(dir);
}

}  // namespace soak_test
