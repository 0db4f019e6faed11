#include "gradaccum/formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "gradaccum/base/check.h"
#include "gradaccum/base/files.h"

// The format is little-endian; tensors are copied byte for byte.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace gradaccum::formats {

namespace {

struct DtypeInfo {
  const char* name;
  torch::ScalarType type;
  size_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {"F64", torch::kDouble, 8}, {"F32", torch::kFloat, 4}, {"F16", torch::kHalf, 2},  {"BF16", torch::kBFloat16, 2},
    {"I64", torch::kLong, 8},   {"I32", torch::kInt, 4},   {"I16", torch::kShort, 2}, {"I8", torch::kChar, 1},
    {"U8", torch::kByte, 1},    {"BOOL", torch::kBool, 1},
};

const DtypeInfo* dtype_by_name(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

const DtypeInfo* dtype_by_type(torch::ScalarType type) {
  for (const auto& d : kDtypes)
    if (type == d.type) return &d;
  return nullptr;
}

uint64_t read_u64_le(const char* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;
}

// One header entry, validated against the data region but not yet copied.
struct Entry {
  std::string name;
  const DtypeInfo* dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

Entry parse_entry(const std::string& name, const nlohmann::json& j, uint64_t data_size, const std::string& what) {
  GA_CHECK(j.is_object(), "{}: tensor {}: header entry is not a JSON object", what, name);
  for (const char* key : {"dtype", "shape", "data_offsets"})
    GA_CHECK(j.contains(key), "{}: tensor {}: header entry has no \"{}\"", what, name, key);
  const auto& dtype = j["dtype"];
  const auto& shape = j["shape"];
  const auto& offsets = j["data_offsets"];
  GA_CHECK(dtype.is_string(), "{}: tensor {}: \"dtype\" is not a string", what, name);
  Entry e{name, dtype_by_name(dtype.get<std::string>()), {}, 0, 0};
  GA_CHECK(e.dtype != nullptr, "{}: tensor {}: unknown dtype \"{}\"", what, name, dtype.get<std::string>());

  GA_CHECK(shape.is_array(), "{}: tensor {}: \"shape\" is not an array", what, name);
  // numel * element size must fit the data region, so bounding the running
  // product by it also rules out overflow.
  uint64_t bytes = e.dtype->size;
  bool too_large = false;
  for (const auto& d : shape) {
    GA_CHECK(d.is_number_integer(), "{}: tensor {}: shape {} is not a list of integers", what, name, shape.dump());
    GA_CHECK(d.is_number_unsigned(), "{}: tensor {}: shape {} has a negative dimension", what, name, shape.dump());
    const uint64_t n = d.get<uint64_t>();
    GA_CHECK(n <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "{}: tensor {}: shape {} overflows", what,
             name, shape.dump());
    if (n == 0) {
      bytes = 0;
    } else if (!too_large && bytes > std::numeric_limits<uint64_t>::max() / n) {
      too_large = true;
    } else if (!too_large) {
      bytes *= n;
    }
    e.shape.push_back(static_cast<int64_t>(n));
  }
  if (bytes == 0) too_large = false;  // a zero dimension anywhere makes the tensor empty
  GA_CHECK(!too_large, "{}: tensor {}: shape {} overflows", what, name, shape.dump());

  GA_CHECK(
      offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(),
      "{}: tensor {}: \"data_offsets\" {} is not [begin, end] of non-negative integers", what, name, offsets.dump());
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  GA_CHECK(e.begin <= e.end, "{}: tensor {}: data_offsets [{}, {}] end before begin", what, name, e.begin, e.end);
  GA_CHECK(e.end <= data_size, "{}: tensor {}: data_offsets [{}, {}] extend past the data region of {} bytes", what,
           name, e.begin, e.end, data_size);
  GA_CHECK(e.end - e.begin == bytes, "{}: tensor {}: data_offsets [{}, {}] hold {} bytes, but {} {} needs {}", what,
           name, e.begin, e.end, e.end - e.begin, e.dtype->name, shape.dump(), bytes);
  return e;
}

torch::Tensor copy_out(const Entry& e, const char* data, const std::string& what) {
  auto t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype->type));
  // memcpy, not from_blob: the data region need not be aligned to the element size.
  if (e.end > e.begin) std::memcpy(t.data_ptr(), data + e.begin, e.end - e.begin);
  if (e.dtype->type == torch::kBool) {
    // Any byte but 0 or 1 would be an invalid bool for libtorch.
    GA_CHECK(t.view(torch::kByte).le(1).all().item<bool>(), "{}: tensor {}: BOOL data holds a byte other than 0 or 1",
             what, e.name);
  }
  return t;
}

}  // namespace

NamedTensors parse_safetensors(std::string_view bytes, const std::string& what,
                               std::map<std::string, std::string>* metadata) {
  GA_CHECK(bytes.size() >= 8, "{}: not a safetensors file: {} bytes, shorter than the 8-byte header length", what,
           bytes.size());
  const uint64_t header_size = read_u64_le(bytes.data());
  GA_CHECK(header_size <= kSafetensorsMaxHeaderBytes, "{}: safetensors header length {} exceeds the limit of {} bytes",
           what, header_size, kSafetensorsMaxHeaderBytes);
  GA_CHECK(header_size <= bytes.size() - 8,
           "{}: safetensors header length {} exceeds the {} bytes after it (truncated file?)", what, header_size,
           bytes.size() - 8);
  const std::string_view header_text = bytes.substr(8, header_size);
  const char* data = bytes.data() + 8 + header_size;
  const uint64_t data_size = bytes.size() - 8 - header_size;

  // nlohmann::json keeps the last of duplicate keys silently; the callback
  // sees every top-level key (depth 1) so duplicates can be refused.
  std::set<std::string> seen;
  std::string duplicate;
  auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && duplicate.empty() &&
        !seen.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text.begin(), header_text.end(), on_event);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann quotes the last bytes read, which may hold newlines.
    std::string message = e.what();
    std::replace(message.begin(), message.end(), '\n', ' ');
    throw Error(fmt::format("{}: safetensors header is not valid JSON: {}", what, message));
  }
  GA_CHECK(header.is_object(), "{}: safetensors header is not a JSON object", what);
  GA_CHECK(duplicate.empty(), "{}: tensor {}: name appears twice in the header", what, duplicate);

  if (metadata) metadata->clear();
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      GA_CHECK(value.is_object(), "{}: \"__metadata__\" is not a JSON object", what);
      for (const auto& [key, text] : value.items()) {
        GA_CHECK(text.is_string(), "{}: \"__metadata__\" value of \"{}\" is not a string", what, key);
        if (metadata) (*metadata)[key] = text.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(name, value, data_size, what));
  }

  // Overlap: sorted by begin, each non-empty range must start at or after the
  // end of every earlier one.
  std::vector<const Entry*> by_offset;
  for (const auto& e : entries)
    if (e.end > e.begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry& prev = *by_offset[i - 1];
    const Entry& cur = *by_offset[i];
    GA_CHECK(cur.begin >= prev.end, "{}: tensor {}: data_offsets [{}, {}] overlap tensor {} [{}, {}]", what, cur.name,
             cur.begin, cur.end, prev.name, prev.begin, prev.end);
  }

  NamedTensors tensors;
  tensors.reserve(entries.size());
  for (const auto& e : entries) tensors.emplace_back(e.name, copy_out(e, data, what));
  return tensors;  // header.items() iterates in key order: sorted by name
}

NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  GA_CHECK(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("{}: not a regular file", path));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return parse_safetensors({}, path, metadata);  // reports the short file
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  GA_CHECK(map != MAP_FAILED, "{}: cannot map: {}", path, std::strerror(errno));
  struct Unmap {
    void* p;
    size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{map, size};
  return parse_safetensors(std::string_view(static_cast<const char*>(map), size), path, metadata);
}

namespace {
// A safetensors file as the pieces it is written from: the 8-byte header size
// and the header (in `header`), then each tensor's bytes, read in place from
// `tensors` (contiguous CPU copies only where the input was not).
struct SafetensorsLayout {
  std::string header;
  std::vector<torch::Tensor> tensors;
  std::vector<std::string_view> pieces;
};

SafetensorsLayout layout_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  struct Item {
    const std::string* name;
    torch::Tensor data;  // contiguous CPU
    const DtypeInfo* dtype;
  };
  std::vector<Item> items;
  std::set<std::string> names;
  for (const auto& [name, tensor] : tensors) {
    GA_CHECK(!name.empty(), "safetensors: a tensor has an empty name");
    GA_CHECK(name != "__metadata__", "safetensors: \"__metadata__\" is not a valid tensor name");
    GA_CHECK(names.insert(name).second, "safetensors: tensor {}: name given twice", name);
    GA_CHECK(tensor.defined(), "safetensors: tensor {}: undefined tensor", name);
    const DtypeInfo* dtype = dtype_by_type(tensor.scalar_type());
    GA_CHECK(dtype != nullptr, "safetensors: tensor {}: dtype {} is not supported", name,
             c10::toString(tensor.scalar_type()));
    items.push_back({&name, tensor.detach().to(torch::kCPU).contiguous(), dtype});
  }
  // Largest elements first keeps every tensor aligned to its element size.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.dtype->size != b.dtype->size ? a.dtype->size > b.dtype->size : *a.name < *b.name;
  });

  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& item : items) {
    const uint64_t n = static_cast<uint64_t>(item.data.numel()) * item.dtype->size;
    header[*item.name] = {
        {"dtype", item.dtype->name}, {"shape", item.data.sizes().vec()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("safetensors: cannot encode the header: {}", e.what()));
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  SafetensorsLayout layout;
  const uint64_t header_size = header_text.size();
  layout.header.append(reinterpret_cast<const char*>(&header_size), 8);
  layout.header += header_text;
  layout.pieces.emplace_back(layout.header);
  for (auto& item : items) {
    layout.pieces.emplace_back(static_cast<const char*>(item.data.data_ptr()),
                               static_cast<size_t>(item.data.numel()) * item.dtype->size);
    layout.tensors.push_back(std::move(item.data));  // keeps the bytes alive
  }
  return layout;
}
}  // namespace

std::string serialize_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  const auto layout = layout_safetensors(tensors, metadata);
  size_t total = 0;
  for (const auto piece : layout.pieces) total += piece.size();
  std::string out;
  out.reserve(total);
  for (const auto piece : layout.pieces) out.append(piece);
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const auto layout = layout_safetensors(tensors, metadata);
  base::write_file_atomically(path, layout.pieces);
}

}  // namespace gradaccum::formats
