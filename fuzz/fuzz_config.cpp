// libFuzzer target: io::load_config on an arbitrary YAML file and overrides.
//
// The input up to its first NUL byte is the configuration file; after it, each
// line is one `--set` override. load_config reads a path, so the file part is
// written to a temporary file (one per process, rewritten for each input).
// A finding is a crash, a sanitizer report, or an exception other than
// gradaccum::Error (a YAML::Exception or std::bad_alloc escaping, say).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "gradaccum/base/check.h"
#include "gradaccum/io/config.h"

namespace {

const std::string& temp_path() {
  static const std::string path = [] {
    std::string p = "/tmp/gradaccum_fuzz_config_" + std::to_string(getpid()) + ".yaml";
    std::atexit([] { std::remove(temp_path().c_str()); });
    return p;
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto nul = input.find('\0');
  const auto file = input.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string_view::npos) {
    auto rest = input.substr(nul + 1);
    while (!rest.empty()) {
      const auto nl = rest.find('\n');
      overrides.emplace_back(rest.substr(0, nl));
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    }
  }
  std::FILE* f = std::fopen(temp_path().c_str(), "wb");
  FUZZ_CHECK(f != nullptr);
  FUZZ_CHECK(std::fwrite(file.data(), 1, file.size(), f) == file.size());
  FUZZ_CHECK(std::fclose(f) == 0);
  try {
    const auto config = gradaccum::io::load_config(temp_path(), overrides);
    // Accepted configurations are written out; that must not throw either.
    FUZZ_CHECK(!config.resolved_yaml.empty());
  } catch (const gradaccum::Error&) {
  }
  return 0;
}
