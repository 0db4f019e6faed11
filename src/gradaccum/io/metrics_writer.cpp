#include "gradaccum/io/metrics_writer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "gradaccum/base/check.h"
#include "gradaccum/io/process_stats.h"

namespace gradaccum::io {

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    GA_CHECK(out.good(), "{}: cannot write", temporary);
    out << text;
    out.flush();
    GA_CHECK(out.good(), "{}: write failed", temporary);
  }
  GA_CHECK(std::rename(temporary.c_str(), path.c_str()) == 0, "{}: cannot rename to {}", temporary, path);
}

void open_step_log(std::ofstream& out, const std::string& path, int64_t resumed_at_step) {
  if (resumed_at_step >= 0) {
    // Keep the lines of the steps the checkpoint holds; later ones describe
    // work that is lost and will be redone.
    std::string kept;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
          j["step"].get<int64_t>() <= resumed_at_step) {
        kept += line + "\n";
      }
    }
    write_file_atomically(path, kept);
    out.open(path, std::ios::app);
  } else {
    out.open(path, std::ios::trunc);
  }
  GA_CHECK(out.good(), "{}: cannot write", path);
}

MetricsWriter::MetricsWriter(const std::string& output_dir, bool items_are_tokens, int64_t resumed_at_step)
    : output_dir_(output_dir), items_are_tokens_(items_are_tokens) {
  open_step_log(metrics_, (std::filesystem::path(output_dir) / "metrics.jsonl").string(), resumed_at_step);
}

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
    j["allreduce_calls"] = r.allreduce_calls;
    j["allreduce_bytes"] = r.allreduce_bytes;
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

void MetricsWriter::write_line(const nlohmann::json& line) {
  metrics_ << line.dump() << '\n';
  metrics_.flush();  // a crashed run keeps every completed step
}

void MetricsWriter::on_start(const core::RunInfo& info) { info_ = info; }

void MetricsWriter::on_step(const core::StepRecord& record) {
  last_micro_batch_ = record.micro_batch_size;
  last_accumulation_ = record.gradient_accumulation_steps;
  write_line(to_json(record, items_are_tokens_));
}

void MetricsWriter::on_eval(const core::EvalRecord& record) { write_line(to_json(record)); }

void MetricsWriter::on_end(const core::TrainSummary& s) {
  nlohmann::json j = {
      {"steps", s.steps},
      {"samples", s.samples},
      {"items", s.items},
      {"wall_s", s.wall_s},
      {"train_loss", s.train_loss},
      {"final_loss", s.final_loss},
      {"samples_per_s", s.samples_per_s},
      {"items_per_s", s.items_per_s},
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
  if (items_are_tokens_) j["tokens_per_s"] = s.items_per_s;
  if (const double device_mb = peak_cuda_mb(); device_mb > 0.0) j["peak_device_mb"] = device_mb;
  if (s.has_eval) {
    const auto eval = to_json(s.eval);
    for (const auto& [key, value] : eval.items()) {
      if (key != "step") j[key] = value;
    }
  }
  write_file_atomically((std::filesystem::path(output_dir_) / "summary.json").string(), j.dump(2) + "\n");
}

}  // namespace gradaccum::io
