// llama.cpp's GGUF files (versions 2 and 3, little-endian), read by hand: the
// metadata, the tensor infos, and the tensors dequantized to float32.
//
// Layout: "GGUF", u32 version, u64 tensor count, u64 metadata count; the
// metadata as (string key, u32 value type, value); the tensor infos as (string
// name, u32 dimension count, u64 dims innermost first, u32 GGML type, u64
// offset into the data section); then, at the next multiple of the alignment
// (the metadata's general.alignment, 32 when absent), the data section. A
// string is a u64 byte count and the bytes; an array is a u32 element type, a
// u64 count and the elements. Versions 2 and 3 lay out little-endian files the
// same way (3 added big-endian files, which are refused).
//
// Nothing in the file is trusted: every count, length, dimension product and
// offset is checked against the file's size and against overflow before
// anything is allocated, and every malformation is a one-line gradaccum::Error
// naming the file and the key or tensor. The file stays memory-mapped while a
// GgufFile (or a copy of it) lives; tensors are read from it on request.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gradaccum::formats {

// The type of a metadata value, with the file's numbers.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "UINT32", "STRING", ... (the names the gguf Python package gives them).
const char* gguf_type_name(GgufType type);

// One tensor as the file describes it. Its data lies at [offset, offset + bytes)
// of the file.
struct GgufTensorInfo {
  std::string name;
  // Row-major (outermost first), as a torch tensor's sizes: the file's dims
  // reversed. A [576, 49152] token_embd in the file is {49152, 576} here.
  std::vector<int64_t> shape;
  uint32_t ggml_type = 0;  // GGML's number for the type (0 F32, 1 F16, 2 Q4_0, ...)
  std::string type_name;   // "F32", "Q4_1", ...
  uint64_t offset = 0;     // from the start of the file
  uint64_t bytes = 0;
  int64_t numel = 0;
};

// A parsed GGUF file. Cheap to copy (the copies share the mapping and the
// parsed metadata).
class GgufFile {
 public:
  // Maps and parses `path`; throws gradaccum::Error naming it on any problem.
  static GgufFile open(const std::string& path);

  const std::string& path() const;
  uint32_t version() const;
  uint64_t alignment() const;
  uint64_t data_offset() const;  // where the data section starts in the file

  // Metadata. Every getter throws a one-line error naming the file and the key
  // when the key is absent or its value has another type.
  bool has(const std::string& key) const;
  const std::vector<std::string>& keys() const;  // in file order
  GgufType type(const std::string& key) const;
  GgufType array_type(const std::string& key) const;  // the elements' type of an array
  uint64_t array_size(const std::string& key) const;
  // Integers of any width and signedness, when the value fits the result.
  uint32_t u32(const std::string& key) const;
  uint64_t u64(const std::string& key) const;
  int32_t i32(const std::string& key) const;
  int64_t i64(const std::string& key) const;
  float f32(const std::string& key) const;   // FLOAT32 only
  double f64(const std::string& key) const;  // FLOAT32 or FLOAT64
  bool boolean(const std::string& key) const;
  const std::string& string(const std::string& key) const;
  const std::vector<std::string>& string_array(const std::string& key) const;
  // An array of integers of any width, each of which must fit int64.
  std::vector<int64_t> i64_array(const std::string& key) const;
  std::vector<float> f32_array(const std::string& key) const;  // FLOAT32 elements

  // Tensors, in file order.
  const std::vector<GgufTensorInfo>& tensors() const;
  bool has_tensor(const std::string& name) const;
  const GgufTensorInfo& tensor(const std::string& name) const;
  // The tensor as a new contiguous float32 CPU tensor of its shape. F32, F16,
  // BF16, Q8_0, Q4_0 and Q4_1 are decoded exactly as llama.cpp's reference
  // dequantization does (bit for bit); any other type is an error naming it.
  torch::Tensor dequantize(const std::string& name) const;

  struct Impl;

 private:
  explicit GgufFile(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace gradaccum::formats
