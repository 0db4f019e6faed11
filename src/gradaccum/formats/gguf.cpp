#include "gradaccum/formats/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <utility>

#include "gradaccum/base/check.h"

// The format is little-endian; values are copied byte for byte.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF I/O assumes a little-endian host");

namespace gradaccum::formats {

// The parsed file. Metadata values keep every element widened: integers and
// bools as 64 bits (signed ones sign-extended), floats as double (exact for
// FLOAT32), strings as they are; a scalar is one element.
struct GgufFile::Impl {
  struct Value {
    GgufType type = GgufType::kUint8;
    GgufType element_type = GgufType::kUint8;  // of an array
    std::vector<uint64_t> integers;
    std::vector<double> floats;
    std::vector<std::string> strings;
  };

  std::string path;
  const uint8_t* data = nullptr;  // the whole file, mapped read-only
  uint64_t size = 0;
  uint32_t version = 0;
  uint64_t alignment = 32;
  uint64_t data_offset = 0;
  std::vector<std::string> keys;
  std::unordered_map<std::string, Value> values;
  std::vector<GgufTensorInfo> tensors;
  std::unordered_map<std::string, size_t> tensor_index;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    if (data != nullptr) ::munmap(const_cast<uint8_t*>(data), size);
  }

  const Value& value(const std::string& key) const {
    const auto it = values.find(key);
    GA_CHECK(it != values.end(), "{}: metadata key {} is absent", path, key);
    return it->second;
  }
};

namespace {

constexpr uint32_t kGgufMaxDims = 4;  // GGML_MAX_DIMS: llama.cpp refuses more

// A GGML tensor type: its name and how many bytes hold a block of how many weights.
struct GgmlTypeInfo {
  uint32_t id;
  const char* name;
  uint64_t block_weights;
  uint64_t block_bytes;
};

// Every type llama.cpp writes (ggml.h's ggml_type, ggml.c's type traits); the
// numbers missing here were removed from GGML and are refused as unknown.
constexpr GgmlTypeInfo kGgmlTypes[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},      {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},      {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 40},
    {10, "Q2_K", 256, 84},    {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},   {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},   {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},        {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},   {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
    {40, "NVFP4", 64, 36},    {41, "Q1_0", 128, 18},
};

const GgmlTypeInfo* ggml_type_info(uint32_t id) {
  for (const auto& t : kGgmlTypes)
    if (t.id == id) return &t;
  return nullptr;
}

bool is_valid_gguf_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

bool is_gguf_integer(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kUint16:
    case GgufType::kInt16:
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kUint64:
    case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

bool is_gguf_signed(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 || t == GgufType::kInt64;
}

// Bytes of one value of a fixed-size type; 0 for STRING and ARRAY.
uint64_t gguf_scalar_bytes(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

// A bounds-checked cursor over the mapped file. `what` in each call names the
// key or tensor being read, for the error when the file ends too soon.
class GgufCursor {
 public:
  GgufCursor(const uint8_t* data, uint64_t size, const std::string& path) : data_(data), size_(size), path_(path) {}

  uint64_t position() const { return position_; }
  uint64_t remaining() const { return size_ - position_; }

  const uint8_t* take(uint64_t n, const std::string& what) {
    GA_CHECK(n <= remaining(), "{}: truncated: {} needs {} bytes at offset {}, but the file ends after {}", path_, what,
             n, position_, remaining());
    const uint8_t* p = data_ + position_;
    position_ += n;
    return p;
  }

  template <typename T>
  T read(const std::string& what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }

  std::string read_string(const std::string& what) {
    const auto n = read<uint64_t>(what);
    const uint8_t* p = take(n, what);  // checked against the file before the string is made
    return std::string(reinterpret_cast<const char*>(p), n);
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t position_ = 0;
  const std::string& path_;
};

// Reads one element of scalar type `t` into `v`.
void read_gguf_element(GgufCursor& in, GgufType t, GgufFile::Impl::Value& v, const std::string& path,
                       const std::string& what) {
  switch (t) {
    case GgufType::kUint8:
      v.integers.push_back(in.read<uint8_t>(what));
      break;
    case GgufType::kInt8:
      v.integers.push_back(static_cast<uint64_t>(static_cast<int64_t>(in.read<int8_t>(what))));
      break;
    case GgufType::kUint16:
      v.integers.push_back(in.read<uint16_t>(what));
      break;
    case GgufType::kInt16:
      v.integers.push_back(static_cast<uint64_t>(static_cast<int64_t>(in.read<int16_t>(what))));
      break;
    case GgufType::kUint32:
      v.integers.push_back(in.read<uint32_t>(what));
      break;
    case GgufType::kInt32:
      v.integers.push_back(static_cast<uint64_t>(static_cast<int64_t>(in.read<int32_t>(what))));
      break;
    case GgufType::kUint64:
    case GgufType::kInt64:
      v.integers.push_back(in.read<uint64_t>(what));
      break;
    case GgufType::kFloat32:
      v.floats.push_back(in.read<float>(what));
      break;
    case GgufType::kFloat64:
      v.floats.push_back(in.read<double>(what));
      break;
    case GgufType::kBool: {
      const auto b = in.read<uint8_t>(what);
      GA_CHECK(b <= 1, "{}: {}: BOOL byte {} is neither 0 nor 1", path, what, b);
      v.integers.push_back(b);
      break;
    }
    case GgufType::kString:
      v.strings.push_back(in.read_string(what));
      break;
    case GgufType::kArray:
      break;  // refused by the caller
  }
}

GgufFile::Impl::Value read_gguf_value(GgufCursor& in, const std::string& path, const std::string& key) {
  const std::string what = "metadata key " + key;
  GgufFile::Impl::Value v;
  const auto type = in.read<uint32_t>(what);
  GA_CHECK(is_valid_gguf_type(type), "{}: {}: unknown value type {}", path, what, type);
  v.type = static_cast<GgufType>(type);
  if (v.type != GgufType::kArray) {
    read_gguf_element(in, v.type, v, path, what);
    return v;
  }
  const auto element = in.read<uint32_t>(what);
  GA_CHECK(is_valid_gguf_type(element), "{}: {}: array of unknown value type {}", path, what, element);
  v.element_type = static_cast<GgufType>(element);
  GA_CHECK(v.element_type != GgufType::kArray, "{}: {}: arrays of arrays are not supported", path, what);
  const auto count = in.read<uint64_t>(what);
  // A string takes at least its 8-byte length: the count is bounded by the
  // bytes left before anything is reserved.
  const uint64_t least = v.element_type == GgufType::kString ? 8 : gguf_scalar_bytes(v.element_type);
  GA_CHECK(count <= in.remaining() / least,
           "{}: truncated: {} claims {} {} elements, more than the {} bytes left in the file hold", path, what, count,
           gguf_type_name(v.element_type), in.remaining());
  if (v.element_type == GgufType::kString) {
    v.strings.reserve(count);
  } else if (v.element_type == GgufType::kFloat32 || v.element_type == GgufType::kFloat64) {
    v.floats.reserve(count);
  } else {
    v.integers.reserve(count);
  }
  for (uint64_t i = 0; i < count; ++i) read_gguf_element(in, v.element_type, v, path, what);
  return v;
}

// The product of `dims` in `numel`; false when a dim, or the product of dims
// none of which is 0, exceeds int64.
bool gguf_numel(const std::vector<uint64_t>& dims, int64_t& numel) {
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (std::any_of(dims.begin(), dims.end(), [&](uint64_t d) { return d > kMax; })) return false;
  if (std::find(dims.begin(), dims.end(), uint64_t{0}) != dims.end()) {
    numel = 0;
    return true;
  }
  uint64_t product = 1;
  for (const auto d : dims) {
    if (product > kMax / d) return false;
    product *= d;
  }
  numel = static_cast<int64_t>(product);
  return true;
}

GgufTensorInfo read_gguf_tensor_info(GgufCursor& in, const std::string& path, uint64_t index) {
  GgufTensorInfo t;
  t.name = in.read_string(fmt::format("the name of tensor {}", index));
  const std::string what = "tensor " + t.name;
  const auto n_dims = in.read<uint32_t>(what);
  GA_CHECK(n_dims <= kGgufMaxDims, "{}: {}: {} dimensions, more than GGUF's {}", path, what, n_dims, kGgufMaxDims);
  std::vector<uint64_t> dims(n_dims);
  for (auto& d : dims) d = in.read<uint64_t>(what);
  const auto type = in.read<uint32_t>(what);
  t.offset = in.read<uint64_t>(what);

  const GgmlTypeInfo* info = ggml_type_info(type);
  GA_CHECK(info != nullptr, "{}: {}: unknown GGML type {}", path, what, type);
  t.ggml_type = type;
  t.type_name = info->name;
  GA_CHECK(gguf_numel(dims, t.numel), "{}: {}: dims [{}] overflow", path, what, fmt::join(dims, ", "));
  const uint64_t innermost = dims.empty() ? 1 : dims[0];
  GA_CHECK(innermost % info->block_weights == 0,
           "{}: {}: {} packs blocks of {} weights, but the innermost dimension is {}", path, what, info->name,
           info->block_weights, innermost);
  const uint64_t blocks = static_cast<uint64_t>(t.numel) / info->block_weights;
  GA_CHECK(blocks <= std::numeric_limits<uint64_t>::max() / info->block_bytes, "{}: {}: dims [{}] overflow", path, what,
           fmt::join(dims, ", "));
  t.bytes = blocks * info->block_bytes;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) t.shape.push_back(static_cast<int64_t>(*it));
  return t;
}

// Checks each tensor's data range against the data section and the other
// tensors', and makes its offset absolute.
void place_gguf_tensors(GgufFile::Impl& f) {
  const uint64_t data_size = f.size > f.data_offset ? f.size - f.data_offset : 0;
  std::vector<GgufTensorInfo*> by_offset;
  for (auto& t : f.tensors) {
    GA_CHECK(t.offset % f.alignment == 0, "{}: tensor {}: offset {} is not a multiple of the alignment {}", f.path,
             t.name, t.offset, f.alignment);
    GA_CHECK(t.offset <= data_size && t.bytes <= data_size - t.offset,
             "{}: truncated: tensor {} needs {} bytes at offset {} of the data section, which holds {}", f.path, t.name,
             t.bytes, t.offset, data_size);
    t.offset += f.data_offset;
    if (t.bytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto& prev = *by_offset[i - 1];
    const auto& cur = *by_offset[i];
    GA_CHECK(cur.offset >= prev.offset + prev.bytes, "{}: tensor {}: its data overlaps tensor {}'s", f.path, cur.name,
             prev.name);
  }
}

// The integer value of `key` as T, when its type is an integer and T holds it.
template <typename T>
T gguf_integer(const GgufFile::Impl& f, const std::string& key, const char* wanted) {
  const auto& v = f.value(key);
  GA_CHECK(is_gguf_integer(v.type), "{}: metadata key {} is {}, not an integer ({} wanted)", f.path, key,
           gguf_type_name(v.type), wanted);
  const uint64_t bits = v.integers[0];
  if (is_gguf_signed(v.type)) {
    const auto s = static_cast<int64_t>(bits);
    GA_CHECK(std::in_range<T>(s), "{}: metadata key {}: {} does not fit {}", f.path, key, s, wanted);
    return static_cast<T>(s);
  }
  GA_CHECK(std::in_range<T>(bits), "{}: metadata key {}: {} does not fit {}", f.path, key, bits, wanted);
  return static_cast<T>(bits);
}

void parse_gguf(GgufFile::Impl& f) {
  GgufCursor in(f.data, f.size, f.path);
  GA_CHECK(f.size >= 4 && std::memcmp(f.data, "GGUF", 4) == 0, "{}: not a GGUF file (it does not start with \"GGUF\")",
           f.path);
  in.take(4, "the magic");
  f.version = in.read<uint32_t>("the version");
  // A big-endian file's version reads byte-swapped here.
  GA_CHECK(f.version != 0x02000000u && f.version != 0x03000000u, "{}: big-endian GGUF files are not supported", f.path);
  GA_CHECK(f.version == 2 || f.version == 3, "{}: GGUF version {} is not supported (only 2 and 3)", f.path, f.version);
  const auto tensor_count = in.read<uint64_t>("the tensor count");
  const auto kv_count = in.read<uint64_t>("the metadata count");

  // The smallest entry is a key's 8-byte length, a 4-byte type and a 1-byte value.
  GA_CHECK(kv_count <= in.remaining() / 13,
           "{}: truncated: the header claims {} metadata entries, more than the {} bytes left in the file hold", f.path,
           kv_count, in.remaining());
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = in.read_string(fmt::format("the key of metadata entry {}", i));
    auto value = read_gguf_value(in, f.path, key);
    GA_CHECK(f.values.emplace(key, std::move(value)).second, "{}: metadata key {} appears twice", f.path, key);
    f.keys.push_back(std::move(key));
  }
  if (f.values.count("general.alignment")) {
    f.alignment = gguf_integer<uint32_t>(f, "general.alignment", "UINT32");
    GA_CHECK(f.alignment > 0 && (f.alignment & (f.alignment - 1)) == 0,
             "{}: metadata key general.alignment: {} is not a power of two", f.path, f.alignment);
  }

  // The smallest tensor info: the name's length, the dimension count, the type, the offset.
  GA_CHECK(tensor_count <= in.remaining() / 24,
           "{}: truncated: the header claims {} tensors, more than the {} bytes left in the file hold", f.path,
           tensor_count, in.remaining());
  f.tensors.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    auto t = read_gguf_tensor_info(in, f.path, i);
    GA_CHECK(f.tensor_index.emplace(t.name, f.tensors.size()).second, "{}: tensor {} appears twice", f.path, t.name);
    f.tensors.push_back(std::move(t));
  }
  // position ≤ size < 2^63 and the alignment is below 2^32: no overflow.
  const uint64_t position = in.position();
  const uint64_t rest = position % f.alignment;
  f.data_offset = rest == 0 ? position : position + (f.alignment - rest);
  place_gguf_tensors(f);
}

const GgufFile::Impl::Value& gguf_array(const GgufFile::Impl& f, const std::string& key) {
  const auto& v = f.value(key);
  GA_CHECK(v.type == GgufType::kArray, "{}: metadata key {} is {}, not an ARRAY", f.path, key, gguf_type_name(v.type));
  return v;
}

// A float16 at `p` (any alignment) as float32 (exact).
float gguf_half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return c10::detail::fp16_ieee_to_fp32_value(bits);
}

// The tensor's blocks of 32 weights, each `block_bytes` long, decoded by
// `decode(block, 32 outputs)` into a float32 tensor of its shape, in parallel.
template <typename Decode>
torch::Tensor gguf_decode_blocks(const GgufFile::Impl& f, const GgufTensorInfo& t, uint64_t block_bytes,
                                 Decode decode) {
  auto out = torch::empty(t.shape, torch::kFloat);
  const uint8_t* in = f.data + t.offset;
  float* values = out.data_ptr<float>();
  at::parallel_for(0, t.numel / 32, 2048, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) decode(in + b * block_bytes, values + b * 32);
  });
  return out;
}

}  // namespace

const char* gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
      return "UINT8";
    case GgufType::kInt8:
      return "INT8";
    case GgufType::kUint16:
      return "UINT16";
    case GgufType::kInt16:
      return "INT16";
    case GgufType::kUint32:
      return "UINT32";
    case GgufType::kInt32:
      return "INT32";
    case GgufType::kFloat32:
      return "FLOAT32";
    case GgufType::kBool:
      return "BOOL";
    case GgufType::kString:
      return "STRING";
    case GgufType::kArray:
      return "ARRAY";
    case GgufType::kUint64:
      return "UINT64";
    case GgufType::kInt64:
      return "INT64";
    case GgufType::kFloat64:
      return "FLOAT64";
  }
  return "unknown";
}

GgufFile GgufFile::open(const std::string& path) {
  auto f = std::make_shared<Impl>();
  f->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  GA_CHECK(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("{}: not a regular file", path));
  }
  f->size = static_cast<uint64_t>(st.st_size);
  if (f->size > 0) {
    void* map = ::mmap(nullptr, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int error = errno;
    ::close(fd);
    GA_CHECK(map != MAP_FAILED, "{}: cannot map: {}", path, std::strerror(error));
    f->data = static_cast<const uint8_t*>(map);
  } else {
    ::close(fd);
  }
  parse_gguf(*f);
  return GgufFile(std::move(f));
}

const std::string& GgufFile::path() const { return impl_->path; }
uint32_t GgufFile::version() const { return impl_->version; }
uint64_t GgufFile::alignment() const { return impl_->alignment; }
uint64_t GgufFile::data_offset() const { return impl_->data_offset; }

bool GgufFile::has(const std::string& key) const { return impl_->values.count(key) > 0; }
const std::vector<std::string>& GgufFile::keys() const { return impl_->keys; }
GgufType GgufFile::type(const std::string& key) const { return impl_->value(key).type; }
GgufType GgufFile::array_type(const std::string& key) const { return gguf_array(*impl_, key).element_type; }

uint64_t GgufFile::array_size(const std::string& key) const {
  const auto& v = gguf_array(*impl_, key);
  return v.integers.size() + v.floats.size() + v.strings.size();  // only one of them is used
}

uint32_t GgufFile::u32(const std::string& key) const { return gguf_integer<uint32_t>(*impl_, key, "UINT32"); }
uint64_t GgufFile::u64(const std::string& key) const { return gguf_integer<uint64_t>(*impl_, key, "UINT64"); }
int32_t GgufFile::i32(const std::string& key) const { return gguf_integer<int32_t>(*impl_, key, "INT32"); }
int64_t GgufFile::i64(const std::string& key) const { return gguf_integer<int64_t>(*impl_, key, "INT64"); }

float GgufFile::f32(const std::string& key) const {
  const auto& v = impl_->value(key);
  GA_CHECK(v.type == GgufType::kFloat32, "{}: metadata key {} is {}, not FLOAT32", impl_->path, key,
           gguf_type_name(v.type));
  return static_cast<float>(v.floats[0]);
}

double GgufFile::f64(const std::string& key) const {
  const auto& v = impl_->value(key);
  GA_CHECK(v.type == GgufType::kFloat32 || v.type == GgufType::kFloat64,
           "{}: metadata key {} is {}, not FLOAT32 or FLOAT64", impl_->path, key, gguf_type_name(v.type));
  return v.floats[0];
}

bool GgufFile::boolean(const std::string& key) const {
  const auto& v = impl_->value(key);
  GA_CHECK(v.type == GgufType::kBool, "{}: metadata key {} is {}, not BOOL", impl_->path, key, gguf_type_name(v.type));
  return v.integers[0] != 0;
}

const std::string& GgufFile::string(const std::string& key) const {
  const auto& v = impl_->value(key);
  GA_CHECK(v.type == GgufType::kString, "{}: metadata key {} is {}, not STRING", impl_->path, key,
           gguf_type_name(v.type));
  return v.strings[0];
}

const std::vector<std::string>& GgufFile::string_array(const std::string& key) const {
  const auto& v = gguf_array(*impl_, key);
  GA_CHECK(v.element_type == GgufType::kString, "{}: metadata key {} is an ARRAY of {}, not of STRING", impl_->path,
           key, gguf_type_name(v.element_type));
  return v.strings;
}

std::vector<int64_t> GgufFile::i64_array(const std::string& key) const {
  const auto& v = gguf_array(*impl_, key);
  GA_CHECK(is_gguf_integer(v.element_type), "{}: metadata key {} is an ARRAY of {}, not of integers", impl_->path, key,
           gguf_type_name(v.element_type));
  std::vector<int64_t> out;
  out.reserve(v.integers.size());
  for (size_t i = 0; i < v.integers.size(); ++i) {
    const uint64_t bits = v.integers[i];
    GA_CHECK(is_gguf_signed(v.element_type) || std::in_range<int64_t>(bits),
             "{}: metadata key {}: element {} is {}, which does not fit INT64", impl_->path, key, i, bits);
    out.push_back(static_cast<int64_t>(bits));
  }
  return out;
}

std::vector<float> GgufFile::f32_array(const std::string& key) const {
  const auto& v = gguf_array(*impl_, key);
  GA_CHECK(v.element_type == GgufType::kFloat32, "{}: metadata key {} is an ARRAY of {}, not of FLOAT32", impl_->path,
           key, gguf_type_name(v.element_type));
  return std::vector<float>(v.floats.begin(), v.floats.end());
}

const std::vector<GgufTensorInfo>& GgufFile::tensors() const { return impl_->tensors; }
bool GgufFile::has_tensor(const std::string& name) const { return impl_->tensor_index.count(name) > 0; }

const GgufTensorInfo& GgufFile::tensor(const std::string& name) const {
  const auto it = impl_->tensor_index.find(name);
  GA_CHECK(it != impl_->tensor_index.end(), "{}: no tensor {}", impl_->path, name);
  return impl_->tensors[it->second];
}

torch::Tensor GgufFile::dequantize(const std::string& name) const {
  const auto& t = tensor(name);
  const auto& type = t.type_name;
  const Impl& f = *impl_;
  // Each weight is computed as llama.cpp's reference dequantization computes
  // it, one rounded float32 operation at a time, so the results match it bit
  // for bit. That needs the compiler not to fuse d·q + m into one multiply-add:
  // the library is built for x86-64 without FMA, where it cannot (the tests
  // compare every weight of a real model with the reference).
  if (type == "F32") {
    auto out = torch::empty(t.shape, torch::kFloat);
    if (t.bytes > 0) std::memcpy(out.data_ptr(), f.data + t.offset, t.bytes);
    return out;
  }
  if (type == "F16" || type == "BF16") {
    auto half = torch::empty(t.shape, type == "F16" ? torch::kHalf : torch::kBFloat16);
    if (t.bytes > 0) std::memcpy(half.data_ptr(), f.data + t.offset, t.bytes);
    return half.to(torch::kFloat);
  }
  if (type == "Q8_0") {
    // A float16 scale d, then 32 int8 q: w = q·d.
    return gguf_decode_blocks(f, t, 34, [](const uint8_t* block, float* w) {
      const float d = gguf_half(block);
      for (int i = 0; i < 32; ++i) w[i] = static_cast<float>(static_cast<int8_t>(block[2 + i])) * d;
    });
  }
  if (type == "Q4_0") {
    // A float16 scale d, then 16 bytes of 4-bit q (the low nibbles are weights
    // 0-15, the high ones 16-31): w = d·(q - 8).
    return gguf_decode_blocks(f, t, 18, [](const uint8_t* block, float* w) {
      const float d = gguf_half(block);
      for (int i = 0; i < 16; ++i) {
        w[i] = d * static_cast<float>((block[2 + i] & 0x0F) - 8);
        w[i + 16] = d * static_cast<float>((block[2 + i] >> 4) - 8);
      }
    });
  }
  if (type == "Q4_1") {
    // A float16 scale d and minimum m, then 16 bytes of 4-bit q as in Q4_0: w = d·q + m.
    return gguf_decode_blocks(f, t, 20, [](const uint8_t* block, float* w) {
      const float d = gguf_half(block), m = gguf_half(block + 2);
      for (int i = 0; i < 16; ++i) {
        w[i] = d * static_cast<float>(block[4 + i] & 0x0F) + m;
        w[i + 16] = d * static_cast<float>(block[4 + i] >> 4) + m;
      }
    });
  }
  throw Error(fmt::format("{}: tensor {}: type {} is not supported (only F32, F16, BF16, Q8_0, Q4_0 and Q4_1)", f.path,
                          name, type));
}

}  // namespace gradaccum::formats
