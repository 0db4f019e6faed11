// TensorBoard's event file: a TFRecord stream of serialized Event messages
// (tensorboard_event.proto), which TensorBoard, torch.utils.tensorboard and HF's
// `report_to: tensorboard` all read. Each record is
//   uint64 length | uint32 masked CRC32C of the length | data | uint32 masked CRC32C of data,
// little-endian, where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace gradaccum::formats {

// TFRecord's checksum of `size` bytes: CRC32C (Castagnoli), masked as above.
uint32_t masked_crc32c(const void* data, size_t size);

class EventFile {
 public:
  // Creates `dir` if needed and, in it, events.out.tfevents.<unix seconds>.<host>.<pid>.gradaccum
  // holding the version event. Throws gradaccum::Error naming `dir` when either cannot be made.
  explicit EventFile(const std::string& dir);
  EventFile(const EventFile&) = delete;
  EventFile& operator=(const EventFile&) = delete;
  ~EventFile();

  // One event at `step` holding every (tag, value) as a scalar (TensorBoard keeps float32).
  void write_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  // One event at `step` holding the histogram of `values` under `tag` (TensorBoard's
  // exponential bucket limits, ±1e-12 × 1.1^k). Values that are not finite (the gradient of an
  // fp16 overflow) are left out: a histogram has no bucket for them.
  void write_histogram(int64_t step, const std::string& tag, const std::vector<double>& values);
  // Hands what is buffered to the operating system; throws gradaccum::Error when the file
  // cannot be written.
  void flush();

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::ofstream out_;
};

}  // namespace gradaccum::formats
