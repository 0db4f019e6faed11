// The safetensors reader and writer: bit-exact round trips of every dtype, the
// header's alignment, metadata, the atomic file writer, and one test per
// malformation the reader must refuse with a one-line error naming the source
// and the tensor.
#include "gradaccum/formats/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <string>

#include "gradaccum/base/check.h"
#include "gradaccum/base/files.h"
#include "test_support.h"

namespace safetensors_test {

namespace fs = std::filesystem;
using gradaccum::Error;
namespace formats = gradaccum::formats;
using gradaccum::formats::load_safetensors;
using gradaccum::formats::NamedTensors;
using gradaccum::formats::parse_safetensors;
using gradaccum::formats::save_safetensors;
using gradaccum::formats::serialize_safetensors;

// The message of the gradaccum::Error that f throws ("" if none).
using gradaccum::testing::error_of;

// A file from a header text and a data region, with an honest length prefix.
std::string file_bytes(const std::string& header, const std::string& data = "") {
  const uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return n;
}

bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         // An empty tensor's data_ptr may be null, which memcmp must not get (UBSan).
         (a.nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
}

// One tensor of every supported dtype, with awkward values and shapes
// (a scalar, an empty tensor, an odd element count before wider types).
formats::NamedTensors every_dtype() {
  const double inf = std::numeric_limits<double>::infinity();
  auto f64 = torch::tensor({1.0 / 3.0, -0.0, inf, -inf, std::nan(""), 1e-310}, torch::kDouble);
  return {
      {"f64", f64.view({2, 3})},
      {"f32", torch::randn({3, 5}, torch::kFloat)},
      {"f16", torch::randn({7}, torch::kFloat).to(torch::kHalf)},
      {"bf16", torch::randn({3}, torch::kFloat).to(torch::kBFloat16)},
      {"i64", torch::tensor({std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{42},
                             std::numeric_limits<int64_t>::max()})},
      {"i32", torch::tensor({-7, 1 << 30}, torch::kInt)},
      {"i16", torch::tensor({-32768, 32767, 5}, torch::kShort)},
      {"i8", torch::tensor({-128, 127, 0}, torch::kChar)},
      {"u8", torch::tensor({0, 255, 17}, torch::kByte).view({1, 3, 1})},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(2.5, torch::kFloat)},
      {"empty", torch::zeros({0, 4}, torch::kFloat)},
  };
}

TEST(Safetensors, RoundTripsEveryDtypeBitExactlyWithMetadata) {
  const auto tensors = every_dtype();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "ünïcode"}};
  const std::string bytes = formats::serialize_safetensors(tensors, metadata);

  std::map<std::string, std::string> read_metadata;
  const auto back = formats::parse_safetensors(bytes, "mem", &read_metadata);
  EXPECT_EQ(read_metadata, metadata);
  ASSERT_EQ(back.size(), tensors.size());
  std::map<std::string, torch::Tensor> by_name(back.begin(), back.end());
  for (const auto& [name, tensor] : tensors) {
    ASSERT_EQ(by_name.count(name), 1u) << name;
    EXPECT_TRUE(same_bytes(by_name.at(name), tensor)) << name;
  }
  // Sorted by name, as documented.
  for (size_t i = 1; i < back.size(); ++i) EXPECT_LT(back[i - 1].first, back[i].first);
}

TEST(Safetensors, HeaderIsPaddedToEightBytesAndEveryTensorAligned) {
  const std::string bytes = formats::serialize_safetensors(every_dtype());
  const uint64_t n = header_length(bytes);
  EXPECT_EQ(n % 8, 0u);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  const std::map<std::string, uint64_t> sizes = {{"F64", 8},  {"I64", 8}, {"F32", 4}, {"I32", 4}, {"F16", 2},
                                                 {"BF16", 2}, {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}};
  uint64_t covered = 0;
  for (const auto& [name, entry] : header.items()) {
    const uint64_t begin = entry["data_offsets"][0];
    const uint64_t end = entry["data_offsets"][1];
    EXPECT_EQ(begin % sizes.at(entry["dtype"]), 0u) << name;
    covered += end - begin;
  }
  EXPECT_EQ(8 + n + covered, bytes.size());  // no holes, nothing after the last tensor
}

TEST(Safetensors, WritesContiguousValuesOfStridedTensors) {
  auto base = torch::arange(12, torch::kFloat).view({3, 4});
  const auto back = formats::parse_safetensors(formats::serialize_safetensors({{"t", base.t()}}), "mem");
  ASSERT_EQ(back.size(), 1u);
  EXPECT_TRUE(torch::equal(back[0].second, base.t()));
  EXPECT_TRUE(back[0].second.is_contiguous());
}

TEST(Safetensors, ReadsUnalignedDataAndOwnsIt) {
  // Data region at an odd address inside the buffer: the reader must copy.
  const float values[2] = {1.5f, -2.25f};
  std::string data(reinterpret_cast<const char*>(values), sizeof(values));
  std::string bytes = " " + file_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data);
  auto back = formats::parse_safetensors(std::string_view(bytes).substr(1), "mem");
  bytes.assign(bytes.size(), '\0');  // the tensor must not alias the buffer
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].second[0].item<float>(), 1.5f);
  EXPECT_EQ(back[0].second[1].item<float>(), -2.25f);
}

TEST(Safetensors, SavesAtomicallyAndLoadsFromDisk) {
  const auto dir = gradaccum::testing::make_temp_dir("safetensors-save");
  const auto path = dir + "/model.safetensors";
  const formats::NamedTensors first = {{"a", torch::ones({2, 2})}};
  const formats::NamedTensors second = {{"b", torch::full({3}, 7.0, torch::kDouble)}};
  formats::save_safetensors(path, first, {{"k", "v"}});
  formats::save_safetensors(path, second);  // replaces the first file
  std::map<std::string, std::string> metadata = {{"stale", "x"}};
  const auto back = formats::load_safetensors(path, &metadata);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].first, "b");
  EXPECT_TRUE(same_bytes(back[0].second, second[0].second));
  EXPECT_TRUE(metadata.empty());
  // Only the file itself is left: no temporary.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) entries += e.path().filename() == "model.safetensors" ? 1 : 100;
  EXPECT_EQ(entries, 1);
}

TEST(Safetensors, FailedSaveLeavesNoTemporaryAndNoFile) {
  const auto dir = gradaccum::testing::make_temp_dir("safetensors-fail");
  // A directory where the file should go: the rename fails.
  fs::create_directory(dir + "/model.safetensors");
  fs::create_directory(dir + "/model.safetensors/inside");
  EXPECT_ONE_LINE_ERROR(formats::save_safetensors(dir + "/model.safetensors", {{"a", torch::ones({1})}}),
                        "model.safetensors: cannot rename");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1);
  EXPECT_ONE_LINE_ERROR(formats::load_safetensors(dir + "/absent.safetensors"), "absent.safetensors: cannot open");
}

TEST(Safetensors, RefusesTensorsItCannotWrite) {
  EXPECT_ONE_LINE_ERROR(formats::serialize_safetensors({{"a", torch::ones({1})}, {"a", torch::ones({1})}}),
                        "tensor a: name given twice");
  EXPECT_ONE_LINE_ERROR(formats::serialize_safetensors({{"__metadata__", torch::ones({1})}}),
                        "\"__metadata__\" is not a valid tensor name");
  EXPECT_ONE_LINE_ERROR(formats::serialize_safetensors({{"c", torch::ones({1}, torch::kComplexFloat)}}),
                        "tensor c: dtype ComplexFloat is not supported");
}

// --- Malformed files --------------------------------------------------------------

// A header with one tensor "w" described by `entry`, and `data_size` data bytes.
std::string one_tensor(const std::string& entry, size_t data_size = 12) {
  return file_bytes(R"({"w":)" + entry + "}", std::string(data_size, '\0'));
}
const std::string kGood = R"({"dtype":"F32","shape":[3],"data_offsets":[0,12]})";

TEST(SafetensorsErrors, TheWellFormedBaselineParses) {
  EXPECT_EQ(formats::parse_safetensors(one_tensor(kGood), "f.st").size(), 1u);
}

TEST(SafetensorsErrors, FileShorterThanTheLengthPrefix) {
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors("abc", "f.st"),
                        "f.st: not a safetensors file: 3 bytes, shorter than the 8-byte header");
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors("", "f.st"), "f.st: not a safetensors file: 0 bytes");
}

TEST(SafetensorsErrors, HeaderLengthBeyondTheFile) {
  std::string bytes = one_tensor(kGood);
  bytes.resize(bytes.size() - 12 - 5);  // cut into the header
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors(bytes, "f.st"),
                        "f.st: safetensors header length 55 exceeds the 50 bytes after it");
}

TEST(SafetensorsErrors, HeaderLengthAboveTheLimit) {
  uint64_t n = 100'000'001;
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  bytes += "{}";
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors(bytes, "f.st"),
                        "f.st: safetensors header length 100000001 exceeds the limit");
}

TEST(SafetensorsErrors, HeaderNotJsonOrNotAnObject) {
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors(file_bytes("{\"w\":\n{"), "f.st"),
                        "f.st: safetensors header is not valid JSON");
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors(file_bytes("[1, 2]"), "f.st"),
                        "f.st: safetensors header is not a JSON object");
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors(file_bytes(R"({"w": 3})"), "f.st"),
                        "f.st: tensor w: header entry is not a JSON object");
}

TEST(SafetensorsErrors, EntryMissingAField) {
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors(one_tensor(R"({"shape":[3],"data_offsets":[0,12]})"), "f.st"),
                        "f.st: tensor w: header entry has no \"dtype\"");
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors(one_tensor(R"({"dtype":"F32","data_offsets":[0,12]})"), "f.st"),
                        "f.st: tensor w: header entry has no \"shape\"");
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors(one_tensor(R"({"dtype":"F32","shape":[3]})"), "f.st"),
                        "f.st: tensor w: header entry has no \"data_offsets\"");
}

TEST(SafetensorsErrors, WrongJsonTypes) {
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(one_tensor(R"({"dtype":4,"shape":[3],"data_offsets":[0,12]})"), "f.st"),
      "tensor w: \"dtype\" is not a string");
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(one_tensor(R"({"dtype":"F32","shape":3,"data_offsets":[0,12]})"), "f.st"),
      "tensor w: \"shape\" is not an array");
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(one_tensor(R"({"dtype":"F32","shape":["3"],"data_offsets":[0,12]})"), "f.st"),
      "tensor w: shape [\"3\"] is not a list of integers");
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(one_tensor(R"({"dtype":"F32","shape":[3.0],"data_offsets":[0,12]})"), "f.st"),
      "tensor w: shape [3.0] is not a list of integers");
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(one_tensor(R"({"dtype":"F32","shape":[3],"data_offsets":"0-12"})"), "f.st"),
      "tensor w: \"data_offsets\" \"0-12\" is not [begin, end]");
}

TEST(SafetensorsErrors, UnknownDtype) {
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(one_tensor(R"({"dtype":"F8_E4M3","shape":[12],"data_offsets":[0,12]})"), "f.st"),
      "f.st: tensor w: unknown dtype \"F8_E4M3\"");
}

TEST(SafetensorsErrors, NegativeOrOverflowingShape) {
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(one_tensor(R"({"dtype":"F32","shape":[-3],"data_offsets":[0,12]})"), "f.st"),
      "f.st: tensor w: shape [-3] has a negative dimension");
  // 2^32 * 2^32 elements: the byte count overflows 64 bits.
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(one_tensor(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,12]})"),
                                 "f.st"),
      "f.st: tensor w: shape [4294967296,4294967296] overflows");
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(one_tensor(R"({"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,12]})"),
                                 "f.st"),
      "overflows");
}

TEST(SafetensorsErrors, DataOffsetsNotABeginEndPair) {
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(one_tensor(R"({"dtype":"F32","shape":[3],"data_offsets":[12]})"), "f.st"),
      "f.st: tensor w: \"data_offsets\" [12] is not [begin, end]");
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(one_tensor(R"({"dtype":"F32","shape":[3],"data_offsets":[-1,11]})"), "f.st"),
      "\"data_offsets\" [-1,11] is not [begin, end] of non-negative integers");
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(one_tensor(R"({"dtype":"F32","shape":[0],"data_offsets":[12,0]})"), "f.st"),
      "f.st: tensor w: data_offsets [12, 0] end before begin");
}

TEST(SafetensorsErrors, DataOffsetsPastTheEnd) {
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors(one_tensor(kGood, /*data_size=*/11), "f.st"),
                        "f.st: tensor w: data_offsets [0, 12] extend past the data region of 11 bytes");
}

TEST(SafetensorsErrors, ByteCountDoesNotMatchShape) {
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(one_tensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,12]})"), "f.st"),
      "f.st: tensor w: data_offsets [0, 12] hold 12 bytes, but F32 [2] needs 8");
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(one_tensor(R"({"dtype":"F64","shape":[3],"data_offsets":[0,12]})"), "f.st"),
      "hold 12 bytes, but F64 [3] needs 24");
}

TEST(SafetensorsErrors, OverlappingTensors) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors(file_bytes(header, std::string(12, '\0')), "f.st"),
                        "f.st: tensor b: data_offsets [4, 12] overlap tensor a [0, 8]");
  // Empty tensors occupy no bytes and overlap nothing.
  const std::string empty = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})";
  EXPECT_EQ(formats::parse_safetensors(file_bytes(empty, std::string(8, '\0')), "f.st").size(), 2u);
}

TEST(SafetensorsErrors, DuplicateNames) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors(file_bytes(header, std::string(8, '\0')), "f.st"),
                        "f.st: tensor w: name appears twice in the header");
}

TEST(SafetensorsErrors, MalformedMetadata) {
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors(file_bytes(R"({"__metadata__":[1]})"), "f.st"),
                        "f.st: \"__metadata__\" is not a JSON object");
  EXPECT_ONE_LINE_ERROR(formats::parse_safetensors(file_bytes(R"({"__metadata__":{"format":1}})"), "f.st"),
                        "f.st: \"__metadata__\" value of \"format\" is not a string");
}

TEST(SafetensorsErrors, BoolBytesOtherThanZeroOrOne) {
  EXPECT_ONE_LINE_ERROR(
      formats::parse_safetensors(
          file_bytes(R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", std::string("\x01\x02", 2)), "f.st"),
      "f.st: tensor m: BOOL data holds a byte other than 0 or 1");
}

TEST(SafetensorsErrors, LoadNamesThePath) {
  const auto dir = gradaccum::testing::make_temp_dir("safetensors-bad");
  const auto path = dir + "/bad.safetensors";
  gradaccum::base::write_file_atomically(path, one_tensor(kGood, 4));
  EXPECT_ONE_LINE_ERROR(formats::load_safetensors(path), path + ": tensor w: data_offsets [0, 12] extend past");
  gradaccum::base::write_file_atomically(path, "");
  EXPECT_ONE_LINE_ERROR(formats::load_safetensors(path), path + ": not a safetensors file: 0 bytes");
  EXPECT_ONE_LINE_ERROR(formats::load_safetensors(dir), dir + ": not a regular file");
}

}  // namespace safetensors_test
