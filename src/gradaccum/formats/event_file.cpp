#include "gradaccum/formats/event_file.h"

#include <unistd.h>

#include <algorithm>
#include <boost/crc.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <numeric>
#include <system_error>

#include "gradaccum/base/check.h"
#include "tensorboard_event.pb.h"

namespace gradaccum::formats {

namespace {

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void append_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// TensorBoard's default histogram bucket limits: ±1e-12 × 1.1^k up to 1e20, 0 between them,
// and DBL_MAX last.
const std::vector<double>& histogram_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> positive;
    for (double v = 1e-12; v < 1e20; v *= 1.1) positive.push_back(v);
    std::vector<double> all;
    for (auto it = positive.rbegin(); it != positive.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), positive.begin(), positive.end());
    all.push_back(std::numeric_limits<double>::max());
    return all;
  }();
  return limits;
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t size) {
  // CRC32C: the Castagnoli polynomial, reflected, initial value and final XOR all ones.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventFile::EventFile(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  GA_CHECK(!error && std::filesystem::is_directory(dir), "logging_dir '{}': cannot create it ({})", dir,
           error ? error.message() : "not a directory");
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "localhost");
  path_ = (std::filesystem::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}.gradaccum",
                                                    static_cast<int64_t>(wall_time()), host,
                                                    static_cast<int64_t>(getpid())))
              .string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  GA_CHECK(out_.good(), "logging_dir '{}': cannot write {}", dir, path_);
  proto::Event event;
  event.set_wall_time(wall_time());
  event.set_file_version("brain.Event:2");
  write_record(event.SerializeAsString());
  flush();
}

EventFile::~EventFile() {
  if (out_.is_open()) out_.flush();
}

void EventFile::write_record(const std::string& data) {
  std::string header;
  append_little_endian(header, data.size(), 8);
  std::string record = header;
  append_little_endian(record, masked_crc32c(header.data(), header.size()), 4);
  record += data;
  append_little_endian(record, masked_crc32c(data.data(), data.size()), 4);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  GA_CHECK(out_.good(), "{}: write failed", path_);
}

void EventFile::write_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  proto::Event event;
  event.set_wall_time(wall_time());
  event.set_step(step);
  auto* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    auto* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  write_record(event.SerializeAsString());
}

void EventFile::write_histogram(int64_t step, const std::string& tag, const std::vector<double>& values) {
  const auto& limits = histogram_limits();
  std::vector<double> counts(limits.size(), 0.0);
  proto::HistogramProto histogram;
  double low = std::numeric_limits<double>::infinity(), high = -low, sum = 0.0, squares = 0.0;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    // The first bucket whose limit is >= v: bucket i holds (limit[i-1], limit[i]].
    const auto k = std::lower_bound(limits.begin(), limits.end(), v) - limits.begin();
    counts[static_cast<size_t>(std::min<std::ptrdiff_t>(k, static_cast<std::ptrdiff_t>(limits.size()) - 1))] += 1;
    low = std::min(low, v);
    high = std::max(high, v);
    sum += v;
    squares += v * v;
  }
  const double num = std::accumulate(counts.begin(), counts.end(), 0.0);
  histogram.set_min(num == 0.0 ? 0.0 : low);
  histogram.set_max(num == 0.0 ? 0.0 : high);
  histogram.set_num(num);
  histogram.set_sum(sum);
  histogram.set_sum_squares(squares);
  // Runs of empty buckets collapse into one, which ends at the run's last limit.
  for (size_t i = 0; i < limits.size();) {
    double end = limits[i], count = counts[i];
    ++i;
    if (count == 0.0) {
      while (i < limits.size() && counts[i] == 0.0) end = limits[i++];
    }
    histogram.add_bucket_limit(end);
    histogram.add_bucket(count);
  }
  proto::Event event;
  event.set_wall_time(wall_time());
  event.set_step(step);
  auto* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  *v->mutable_histo() = std::move(histogram);
  write_record(event.SerializeAsString());
}

void EventFile::flush() {
  out_.flush();
  GA_CHECK(out_.good(), "{}: write failed", path_);
}

}  // namespace gradaccum::formats
