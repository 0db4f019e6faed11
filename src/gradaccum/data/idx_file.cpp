#include "gradaccum/data/idx_file.h"

#include <zlib.h>

#include <array>
#include <filesystem>
#include <memory>

#include "gradaccum/base/check.h"

namespace gradaccum::data {

namespace {
struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

void read_exactly(gzFile file, void* out, size_t bytes, const std::string& path) {
  auto* p = static_cast<char*>(out);
  while (bytes > 0) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(bytes, 1u << 30));
    const int got = gzread(file, p, chunk);
    GA_CHECK(got > 0, "{}: truncated or corrupt IDX file", path);
    p += got;
    bytes -= static_cast<size_t>(got);
  }
}

uint32_t big_endian(const std::array<unsigned char, 4>& b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}
}  // namespace

torch::Tensor read_idx_file(const std::string& path) {
  GA_CHECK(std::filesystem::is_regular_file(path), "{}: no such file", path);
  GzFile file(gzopen(path.c_str(), "rb"));
  GA_CHECK(file != nullptr, "{}: cannot open", path);
  std::array<unsigned char, 4> word{};
  read_exactly(file.get(), word.data(), 4, path);
  const uint32_t magic = big_endian(word);
  // 0x08 = unsigned byte data; the low byte is the number of dimensions.
  GA_CHECK((magic >> 8) == 0x08 && (magic & 0xff) >= 1 && (magic & 0xff) <= 4,
           "{}: not an IDX uint8 file (magic 0x{:08x})", path, magic);
  std::vector<int64_t> shape;
  int64_t numel = 1;
  for (uint32_t d = 0; d < (magic & 0xff); ++d) {
    read_exactly(file.get(), word.data(), 4, path);
    const int64_t n = big_endian(word);
    GA_CHECK(n > 0 && n < (int64_t{1} << 31), "{}: bad dimension {}", path, n);
    shape.push_back(n);
    numel *= n;
  }
  GA_CHECK(numel < (int64_t{1} << 34), "{}: implausible size {}", path, numel);
  auto tensor = torch::empty(shape, torch::kUInt8);
  read_exactly(file.get(), tensor.data_ptr<uint8_t>(), static_cast<size_t>(numel), path);
  char extra = 0;
  GA_CHECK(gzread(file.get(), &extra, 1) == 0, "{}: trailing data after {} bytes", path, numel);
  return tensor;
}

}  // namespace gradaccum::data
