// Reader for the IDX format of (Fashion-)MNIST, gzip-compressed or not.
// Format: big-endian int32 magic (0x00000801 labels, 0x00000803 images), then one
// big-endian int32 per dimension, then uint8 data. zlib's gzread reads both
// compressed and plain files, so no decompressed copy is needed.
#pragma once

#include <torch/torch.h>

#include <string>

namespace gradaccum::data {

// The whole file as a uint8 tensor shaped by its header. Throws gradaccum::Error
// naming the file when it is missing, truncated or not IDX uint8.
torch::Tensor read_idx_file(const std::string& path);

}  // namespace gradaccum::data
