// scripts/soak.sh, short: a two-rank run interrupted by seeded SIGTERMs and SIGKILLs to the
// launcher or a rank, restarted each time with resume_from_checkpoint=auto, ends with the
// uninterrupted run's weights byte for byte, and with W changing at the restarts its trajectory
// (the long soaks' results are in docs/robustness.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

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

// The same with each restart drawing W from {1, 2} (global batch 256: N = 32 or 16): every step's
// loss, grad norm and weight norm follow the uninterrupted two-rank run to float64 rounding, also
// where a window saved at one W is trained again at the other.
TEST(Soak, RestartsAtAnotherWorldSizeFollowTheUninterruptedTrajectory) {
  const auto dir = gradaccum::testing::make_temp_dir("soak-worlds");
  const std::string command = std::string("bash ") + GRADACCUM_SOURCE_DIR +
                              "/scripts/soak.sh --steps 24 --faults 4 --seed 3 --worlds 1,2 --out " + dir +
                              " --gradaccum " + GRADACCUM_CLI + " > " + dir + "/result.json 2> " + dir + "/soak.err";
  ASSERT_EQ(std::system(command.c_str()), 0) << gradaccum::testing::read_text(dir + "/soak.err");
  const auto result = nlohmann::json::parse(gradaccum::testing::read_text(dir + "/result.json"));
  EXPECT_EQ(result["faults"], 4) << result;
  const auto worlds = result["worlds"].get<std::vector<int>>();
  EXPECT_EQ(worlds.size(), result["attempts"].get<size_t>()) << result;
  EXPECT_NE(std::find(worlds.begin(), worlds.end(), 1), worlds.end()) << result;
  EXPECT_NE(std::find(worlds.begin(), worlds.end(), 2), worlds.end()) << result;
  EXPECT_LE(result["largest_difference"].get<double>(), 1e-12) << result;
  EXPECT_EQ(gradaccum::testing::step_records(dir + "/soak/metrics.jsonl").size(), 24u);
  std::filesystem::remove_all(dir);
}

}  // namespace soak_test
