// The CMake package: `cmake --install` of this build into a fresh prefix, then
// examples/custom_model (a libtorch module and dataset of its own, trained through run::fit) built
// against it as an outside project with find_package(gradaccum). It trains 20 steps, writes its
// metrics, and with two ranks follows the one-process run step by step.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>

#include "test_support.h"

namespace install_test {

namespace fs = std::filesystem;
using gradaccum::testing::read_text;
using gradaccum::testing::step_records;

// Runs `command` in a shell; its output goes to `log`. Returns the exit status.
int shell(const std::string& command, const std::string& log) {
  const int status = std::system((command + " > '" + log + "' 2>&1 < /dev/null").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(InstalledPackage, AnOutsideProjectBuildsOnItAndTrainsAlikeOnTwoRanks) {
  const auto dir = gradaccum::testing::make_temp_dir("install");
  const std::string cmake = GRADACCUM_CMAKE, prefix = dir + "/prefix", example = dir + "/example";
  ASSERT_EQ(
      shell("'" + cmake + "' --install '" + GRADACCUM_BUILD_DIR + "' --prefix '" + prefix + "'", dir + "/install.log"),
      0)
      << read_text(dir + "/install.log");
  // The library's headers, not the program's; its private dependencies stay out of the package.
  EXPECT_TRUE(fs::exists(prefix + "/include/gradaccum/run/fit.h"));
  EXPECT_TRUE(fs::exists(prefix + "/include/gradaccum/core/trainer.h"));
  EXPECT_FALSE(fs::exists(prefix + "/include/gradaccum/cli"));
  const auto targets = read_text(prefix + "/lib/cmake/gradaccum/gradaccumTargets.cmake");
  EXPECT_EQ(targets.find("yaml"), std::string::npos);
  EXPECT_EQ(targets.find("pch.h"), std::string::npos);
  EXPECT_EQ(targets.find("ZLIB"), std::string::npos);

  ASSERT_EQ(shell("'" + cmake + "' -S '" + GRADACCUM_SOURCE_DIR + "/examples/custom_model' -B '" + example +
                      "' -DCMAKE_BUILD_TYPE=Release '-DCMAKE_PREFIX_PATH=" + prefix + ";" + GRADACCUM_TORCH_PREFIX +
                      "' '-DCMAKE_CXX_FLAGS=" + GRADACCUM_EXAMPLE_FLAGS + "' '-DCMAKE_EXE_LINKER_FLAGS=" +
                      GRADACCUM_EXAMPLE_FLAGS + "' && '" + cmake + "' --build '" + example + "'",
                  dir + "/build.log"),
            0)
      << read_text(dir + "/build.log");
  // The package hands the program libtorch's libgomp, the one the library links, so CMake finds no
  // second copy of it to warn about.
  EXPECT_EQ(read_text(dir + "/build.log").find("Cannot generate a safe runtime search path"), std::string::npos)
      << read_text(dir + "/build.log");
  const std::string program = example + "/custom_model";
  ASSERT_EQ(shell("'" + program + "' '" + dir + "/one'", dir + "/one.log"), 0) << read_text(dir + "/one.log");
  ASSERT_EQ(shell("'" + program + "' '" + dir + "/two' --nproc 2", dir + "/two.log"), 0) << read_text(dir + "/two.log");
  EXPECT_NE(read_text(dir + "/one.log").find("trained 20 steps, last loss "), std::string::npos)
      << read_text(dir + "/one.log");

  const auto one = step_records(dir + "/one/metrics.jsonl"), two = step_records(dir + "/two/metrics.jsonl");
  ASSERT_EQ(one.size(), 20u);
  ASSERT_EQ(two.size(), 20u);
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(one[i]["samples"], 32) << i;
    EXPECT_EQ(one[i]["micro_steps"], 4) << i;
    EXPECT_EQ(two[i]["micro_steps"], 2) << i;
    EXPECT_EQ(two[i]["world_size"], 2) << i;
    const double loss = one[i]["loss"].get<double>(), norm = one[i]["grad_norm"].get<double>();
    EXPECT_NEAR(two[i]["loss"].get<double>(), loss, 1e-10 * loss) << i;
    EXPECT_NEAR(two[i]["grad_norm"].get<double>(), norm, 1e-10 * norm) << i;
  }
  // It learns: the last window's loss is below the first's.
  EXPECT_LT(one.back()["loss"].get<double>(), 0.8 * one.front()["loss"].get<double>());
  EXPECT_TRUE(fs::exists(dir + "/one/final/model.safetensors"));
  EXPECT_TRUE(fs::exists(dir + "/one/checkpoints/step-20/trainer_state.json"));
  fs::remove_all(dir);
}

}  // namespace install_test
