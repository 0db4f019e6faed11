// What the GGUF tests share: where SmolLM2's file is installed, the skip (with its reason) when it
// is absent, and one run of tests/hf/gguf_transformers_reference.py into a fresh directory.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "test_support.h"

namespace gradaccum::testing {

inline constexpr const char* kSmolLm2Path = "/var/lib/gradaccum/models/SmolLM2-135M-Instruct.Q4_1.gguf";

#define REQUIRE_SMOLLM2()                                                                              \
  if (!std::filesystem::exists(::gradaccum::testing::kSmolLm2Path)) {                                  \
    GTEST_SKIP() << "SmolLM2-135M-Instruct is not installed at " << ::gradaccum::testing::kSmolLm2Path \
                 << " (scripts/setup.sh installs it)";                                                 \
  }

inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The reference script with ARGS, run once per build tree (shared_reference: the directory is
// read by every test process that asks; its log in DIR/log); `error` is the failure message, ""
// when it succeeded.
struct GgufReference {
  std::string dir, error;
};
inline GgufReference run_gguf_reference(const std::string& name, const std::string& args_before_dir) {
  const std::string script = std::string(GRADACCUM_TEST_DATA) + "/../hf/gguf_transformers_reference.py";
  const auto made = shared_reference(name, {script}, [&](const std::string& dir) {
    return "'" + venv_program("python") + "' -B '" + script + "' " + args_before_dir + " '" + dir + "'";
  });
  if (!made.error.empty()) {
    return {made.dir, "tests/hf/gguf_transformers_reference.py " + args_before_dir +
                          " failed (transformers and gguf in the venv? scripts/setup.sh installs them):\n" +
                          made.error};
  }
  return {made.dir, ""};
}

}  // namespace gradaccum::testing
