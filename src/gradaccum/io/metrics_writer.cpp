#include "gradaccum/io/metrics_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "gradaccum/base/check.h"
#include "gradaccum/base/files.h"
#include "gradaccum/io/process_stats.h"

namespace gradaccum::io {

RecordLog::RecordLog(std::string path, int64_t resumed_at_step) : path_(std::move(path)) {
  if (resumed_at_step >= 0) {
    // Keep the lines of the steps the checkpoint holds; later ones describe
    // work that is lost and will be redone (and a line cut short is no record).
    std::string kept;
    std::ifstream in(path_);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
          j["step"].get<int64_t>() <= resumed_at_step) {
        kept += line + "\n";
      }
    }
    base::write_file_atomically(path_, kept);
  }
  const int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (resumed_at_step >= 0 ? 0 : O_TRUNC);
  fd_ = ::open(path_.c_str(), flags, 0644);
  GA_CHECK(fd_ >= 0, "{}: cannot write: {}", path_, std::strerror(errno));
  struct stat info {};
  if (::fstat(fd_, &info) == 0) size_ = info.st_size;
}

RecordLog::~RecordLog() {
  if (fd_ >= 0) ::close(fd_);
}

void RecordLog::append(const nlohmann::json& record) {
  const std::string line = record.dump() + "\n";
  size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;
      // No half record stays behind: the file ends after the last whole one.
      if (written > 0 && ::ftruncate(fd_, size_) != 0) {
        throw Error(fmt::format("{}: write failed: {}; and cutting the partial record failed: {}", path_,
                                std::strerror(error), std::strerror(errno)));
      }
      throw Error(fmt::format("{}: write failed: {}", path_, std::strerror(error)));
    }
    written += static_cast<size_t>(n);
  }
  size_ += static_cast<off_t>(line.size());
}

MetricsWriter::MetricsWriter(const std::string& output_dir, bool items_are_tokens, int64_t resumed_at_step)
    : output_dir_(output_dir),
      items_are_tokens_(items_are_tokens),
      metrics_((std::filesystem::path(output_dir) / "metrics.jsonl").string(), resumed_at_step) {}

nlohmann::json MetricsWriter::to_json(const core::StepRecord& r, bool items_are_tokens) {
  nlohmann::json j = {
      {"step", r.step},
      {"epoch", r.epoch},
      {"loss", r.loss},
      {"lr", r.lr},
      {"grad_norm", r.grad_norm},
      {"grad_norm_clipped", r.grad_norm_clipped},
      {"weight_norm", r.weight_norm},
      {"items", r.items},
      {"samples", r.samples},
      {"micro_steps", r.micro_steps},
      {"micro_batch_size", r.micro_batch_size},
      {"gradient_accumulation_steps", r.gradient_accumulation_steps},
      {"skipped", r.skipped},
      {"time_s", r.time_s},
      {"step_time_s", r.step_time_s},
      {"data_time_s", r.data_time_s},
      {"samples_per_s", r.samples_per_s},
      {"items_per_s", r.items_per_s},
      {"peak_rss_mb", peak_rss_mb()},
  };
  if (items_are_tokens) j["tokens_per_s"] = r.items_per_s;
  if (r.loss_scale > 0.0) j["loss_scale"] = r.loss_scale;  // fp16 runs
  if (r.padded_tokens > 0) {                               // samples with lengths: what padding costs this window
    j["padded_tokens"] = r.padded_tokens;
    j["padding_fraction"] = 1.0 - static_cast<double>(r.sample_tokens) / static_cast<double>(r.padded_tokens);
  }
  if (!r.loss_normalization.empty()) j["loss_normalization"] = r.loss_normalization;
  if (!r.micro_step_items.empty()) {
    const auto [low, high] = std::minmax_element(r.micro_step_items.begin(), r.micro_step_items.end());
    j["micro_step_items"] = r.micro_step_items;
    j["micro_step_items_min"] = *low;
    j["micro_step_items_max"] = *high;
  }
  if (!r.rank_items.empty()) j["rank_items"] = r.rank_items;
  if (r.world_size > 1) {
    j["world_size"] = r.world_size;
    if (r.sharded_grad_sync.empty()) {
      j["allreduce_calls"] = r.allreduce_calls;
      j["allreduce_bytes"] = r.allreduce_bytes;
    } else {
      j["sharded_grad_sync"] = r.sharded_grad_sync;
      j["reduce_scatter_calls"] = r.allreduce_calls;
      j["reduce_scatter_bytes"] = r.allreduce_bytes;
    }
    if (r.all_gather_calls > 0) j["all_gather_calls"] = r.all_gather_calls;
  }
  return j;
}

nlohmann::json MetricsWriter::to_json(const core::EvalRecord& r) {
  nlohmann::json j = {{"step", r.step},
                      {"eval_loss", r.loss},
                      {"eval_samples", r.samples},
                      {"eval_items", r.items},
                      {"eval_time_s", r.time_s}};
  if (!std::isnan(r.accuracy)) j["eval_accuracy"] = r.accuracy;
  return j;
}

// Written through at once: a crashed run keeps every completed step.
void MetricsWriter::write_line(const nlohmann::json& line) { metrics_.append(line); }

void MetricsWriter::on_start(const core::RunInfo& info) { info_ = info; }

void MetricsWriter::on_step(const core::StepRecord& record) {
  last_micro_batch_ = record.micro_batch_size;
  last_accumulation_ = record.gradient_accumulation_steps;
  trained_samples_ += record.samples;
  trained_items_ += record.items;
  write_line(to_json(record, items_are_tokens_));
}

void MetricsWriter::on_eval(const core::EvalRecord& record) { write_line(to_json(record)); }

void MetricsWriter::on_end(const core::TrainSummary& s) {
  const double samples_per_s = s.wall_s > 0 ? static_cast<double>(trained_samples_) / s.wall_s : 0.0;
  const double items_per_s = s.wall_s > 0 ? static_cast<double>(trained_items_) / s.wall_s : 0.0;
  nlohmann::json j = {
      {"steps", s.steps},
      {"samples", s.samples},
      {"items", s.items},
      {"wall_s", s.wall_s},
      {"train_loss", s.train_loss},
      {"final_loss", s.final_loss},
      {"samples_per_s", samples_per_s},
      {"items_per_s", items_per_s},
      {"peak_rss_mb", peak_rss_mb()},
      // The decomposition of the last step: smaller than the configured one after an OOM.
      {"micro_batch", last_micro_batch_ > 0 ? last_micro_batch_ : info_.geometry.micro_batch()},
      {"gradient_accumulation_steps",
       last_accumulation_ > 0 ? last_accumulation_ : info_.geometry.accumulation_steps()},
      {"world_size", info_.geometry.world_size()},
      {"global_batch_size", info_.geometry.global_batch()},
      {"parameters", info_.parameters},
      {"preempted", s.preempted},
  };
  if (items_are_tokens_) j["tokens_per_s"] = items_per_s;
  if (const double device_mb = peak_cuda_mb(); device_mb > 0.0) j["peak_device_mb"] = device_mb;
  if (s.has_eval) {
    const auto eval = to_json(s.eval);
    for (const auto& [key, value] : eval.items()) {
      if (key != "step") j[key] = value;
    }
  }
  base::write_file_atomically((std::filesystem::path(output_dir_) / "summary.json").string(), j.dump(2) + "\n");
  summary_ = std::move(j);
}

void MetricsWriter::add_test(const core::EvalRecord& record) {
  GA_CHECK(summary_.is_object(), "{}: the test figures come after the run's summary", output_dir_);
  const auto test = to_json(record);
  for (const auto& [key, value] : test.items()) {
    if (key.rfind("eval_", 0) == 0) summary_["test_" + key.substr(5)] = value;
  }
  base::write_file_atomically((std::filesystem::path(output_dir_) / "summary.json").string(), summary_.dump(2) + "\n");
}

}  // namespace gradaccum::io
