#include "gradaccum/io/tensorboard_writer.h"

#include <algorithm>
#include <cmath>

namespace gradaccum::io {

namespace {

constexpr auto kFlushInterval = std::chrono::seconds(10);

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& logging_dir, bool items_are_tokens, int64_t logging_steps)
    : file_(logging_dir), items_are_tokens_(items_are_tokens), logging_steps_(logging_steps) {}

void TensorBoardWriter::on_start(const core::RunInfo& info) { total_steps_ = info.total_steps; }

void TensorBoardWriter::write(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  std::vector<std::pair<std::string, double>> finite;
  for (const auto& s : scalars) {
    if (std::isfinite(s.second)) finite.push_back(s);
  }
  file_.write_scalars(step, finite);
}

void TensorBoardWriter::on_step(const core::StepRecord& r) {
  if (r.step % logging_steps_ != 0 && r.step != total_steps_) return;
  std::vector<std::pair<std::string, double>> scalars = {
      {"train/loss", r.loss},
      {"train/lr", r.lr},
      {"train/grad_norm", r.grad_norm},
      {"train/grad_norm_clipped", r.grad_norm_clipped},
      {"train/weight_norm", r.weight_norm},
      {"train/items", static_cast<double>(r.items)},
      {items_are_tokens_ ? "train/tokens_per_s" : "train/samples_per_s",
       items_are_tokens_ ? r.items_per_s : r.samples_per_s},
      {"train/epoch", static_cast<double>(r.epoch)},
  };
  if (r.loss_scale > 0.0) scalars.emplace_back("train/loss_scale", r.loss_scale);
  if (!r.micro_step_items.empty()) {
    const auto [low, high] = std::minmax_element(r.micro_step_items.begin(), r.micro_step_items.end());
    scalars.emplace_back("train/micro_step_items_min", static_cast<double>(*low));
    scalars.emplace_back("train/micro_step_items_max", static_cast<double>(*high));
  }
  write(r.step, scalars);
  if (std::chrono::steady_clock::now() - last_flush_ >= kFlushInterval) {
    file_.flush();
    last_flush_ = std::chrono::steady_clock::now();
  }
}

void TensorBoardWriter::on_eval(const core::EvalRecord& r) {
  std::vector<std::pair<std::string, double>> scalars = {{"eval/loss", r.loss},
                                                         {"eval/items", static_cast<double>(r.items)}};
  if (!std::isnan(r.accuracy)) scalars.emplace_back("eval/accuracy", r.accuracy);
  write(r.step, scalars);
  file_.flush();
  last_flush_ = std::chrono::steady_clock::now();
}

void TensorBoardWriter::on_grad_flow(const core::GradFlowRecord& r) {
  std::vector<std::pair<std::string, double>> scalars;
  for (size_t i = 0; i < r.names.size(); ++i) {
    const std::string prefix = "grad_flow/" + r.names[i] + "/";
    scalars.emplace_back(prefix + "mean_abs", r.mean_abs[i]);
    scalars.emplace_back(prefix + "max_abs", r.max_abs[i]);
    scalars.emplace_back(prefix + "zero_fraction", r.zero_fraction[i]);
  }
  write(r.step, scalars);
  file_.write_histogram(r.step, "grad_flow/mean_abs_across_parameters", r.mean_abs);
}

void TensorBoardWriter::on_end(const core::TrainSummary&) { file_.flush(); }

}  // namespace gradaccum::io
