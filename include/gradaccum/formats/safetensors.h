// The safetensors file format (Hugging Face's weight files), read and written
// by hand: no Debian package provides a C++ implementation.
//
// Layout: an 8-byte little-endian u64 N, then N bytes of JSON header, then the
// data region. The header is an object mapping each tensor name to
//   {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
// (offsets relative to the data region, end exclusive, row-major little-endian
// bytes) plus an optional "__metadata__" object of string → string.
//
// The reader is strict: every inconsistency (truncated file, header length
// beyond the file, bad JSON, wrong field types, unknown dtype, a byte range that
// does not match its shape or lies past the data or overlaps another tensor,
// duplicate names) is a one-line gradaccum::Error naming the source and the
// tensor. Unused bytes between or after tensors are tolerated.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gradaccum::formats {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// A header larger than this is refused before it is parsed (as the reference
// implementation does), so a corrupt length cannot make us allocate gigabytes.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Parses a whole safetensors file held in `bytes`. `what` names the source in
// errors (a path). Tensors come back sorted by name, as owning, contiguous CPU
// tensors copied out of `bytes` (which need not be aligned or outlive them).
// Supported dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL.
// When `metadata` is given it receives "__metadata__" (empty when absent).
NamedTensors parse_safetensors(std::string_view bytes, const std::string& what,
                               std::map<std::string, std::string>* metadata = nullptr);

// Reads and parses the file at `path` (memory-mapped, so the peak is about the
// tensors' size, not twice it).
NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// The bytes of a safetensors file holding `tensors` (any device, any strides;
// written as contiguous CPU copies) and `metadata`. The header is padded with
// spaces so the data region starts at a multiple of 8 bytes, and the data is
// ordered by element size, largest first, then by name, so that every tensor
// is aligned to its element size. Names must be unique, non-empty and not
// "__metadata__".
std::string serialize_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});

// serialize_safetensors written to `path` atomically (base::write_file_atomically),
// straight from the tensors' memory: no second copy of the file is built.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace gradaccum::formats
