// libFuzzer target: Tokenizer::from_hf_json on an arbitrary tokenizer.json,
// then encode/decode of a fixed text with whatever it accepted.
//
// from_hf_json reads a path, so the input is written to a temporary file (one
// per process). A finding is a crash, a sanitizer report, or an exception other
// than gradaccum::Error (nlohmann::json's type_error escaping, say).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "gradaccum/base/check.h"
#include "gradaccum/data/tokenizer.h"

namespace {

const std::string& temp_path() {
  static const std::string path = [] {
    std::string p = "/tmp/gradaccum_fuzz_tokenizer_" + std::to_string(getpid()) + ".json";
    std::atexit([] { std::remove(temp_path().c_str()); });
    return p;
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(temp_path().c_str(), "wb");
  FUZZ_CHECK(f != nullptr);
  FUZZ_CHECK(std::fwrite(data, 1, size, f) == size);
  FUZZ_CHECK(std::fclose(f) == 0);
  try {
    const auto tokenizer = gradaccum::data::Tokenizer::from_hf_json(temp_path());
    const auto ids = tokenizer.encode("Hello world, héllo he\u0301llo \uFB01\n\t<|endoftext|> 123");
    for (const auto id : ids) FUZZ_CHECK(static_cast<size_t>(id) < tokenizer.id_count());
    // A vocabulary may lack pieces, in which case encode has thrown; the
    // decoded bytes are not checked since a fuzzed vocabulary need not be
    // byte-level consistent.
    tokenizer.decode(ids);
  } catch (const gradaccum::Error&) {
  }
  return 0;
}
