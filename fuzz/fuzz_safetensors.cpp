// libFuzzer target: formats::parse_safetensors on arbitrary bytes.
//
// A finding is a crash, a sanitizer report, or an exception other than
// gradaccum::Error. When the bytes parse, the tensors must survive
// formats::serialize_safetensors → formats::parse_safetensors byte for byte (names, dtypes,
// shapes and data), and the metadata must come back unchanged.
#include <cstdint>
#include <cstring>
#include <string_view>

#include "fuzz_check.h"
#include "gradaccum/base/check.h"
#include "gradaccum/formats/safetensors.h"

using gradaccum::formats::NamedTensors;
namespace formats = gradaccum::formats;

namespace {

void check_same(const formats::NamedTensors& a, const formats::NamedTensors& b) {
  FUZZ_CHECK(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    FUZZ_CHECK(a[i].first == b[i].first);
    const auto& x = a[i].second;
    const auto& y = b[i].second;
    FUZZ_CHECK(x.scalar_type() == y.scalar_type());
    FUZZ_CHECK(x.sizes() == y.sizes());
    FUZZ_CHECK(x.is_contiguous() && y.is_contiguous());
    FUZZ_CHECK(x.nbytes() == y.nbytes());
    // Bytes, not values: NaN payloads and -0.0 must round-trip too.
    FUZZ_CHECK(x.nbytes() == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> metadata;
  formats::NamedTensors tensors;
  try {
    tensors = gradaccum::formats::parse_safetensors(bytes, "fuzz", &metadata);
  } catch (const gradaccum::Error&) {
    return 0;  // a rejected file is the expected outcome for most inputs
  }
  std::map<std::string, std::string> metadata2;
  const auto again = gradaccum::formats::parse_safetensors(gradaccum::formats::serialize_safetensors(tensors, metadata),
                                                           "fuzz round trip", &metadata2);
  check_same(tensors, again);
  FUZZ_CHECK(metadata == metadata2);
  return 0;
}
