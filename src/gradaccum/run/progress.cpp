#include "gradaccum/run/progress.h"

#include <fmt/format.h>

#include <cmath>
#include <utility>

namespace gradaccum::run {

Progress::Progress(FILE* out, bool terminal, int64_t logging_steps, std::string eval_split)
    : out_(out), terminal_(terminal), logging_steps_(logging_steps), eval_split_(std::move(eval_split)) {}

void Progress::on_start(const core::RunInfo& info) {
  total_ = info.total_steps;
  interval_ = std::max<int64_t>(logging_steps_, (total_ + 19) / 20);
  fmt::print(out_,
             "training: {} parameters, {} samples, batch {} (micro-batch x accumulation x world), "
             "{} optimizer steps ({} per epoch)\n",
             info.parameters, info.train_samples, info.geometry.to_string(), info.total_steps, info.windows_per_epoch);
  std::fflush(out_);
}

void Progress::on_micro_batch_change(const core::MicroBatchChange& c) {
  if (terminal_) fmt::print(out_, "\n");
  fmt::print(out_,
             "out of memory in step {} at micro-batch {} x {}{}: training the window again as {} x {} "
             "(the same global batch and samples)\n",
             c.step, c.from_micro_batch, c.from_accumulation,
             c.requested_bytes > 0 ? fmt::format(" (a request for {:.1f} MiB failed)",
                                                 static_cast<double>(c.requested_bytes) / (1024.0 * 1024.0))
                                   : std::string(),
             c.to_micro_batch, c.to_accumulation);
  std::fflush(out_);
}

namespace {

// A rate with about three significant digits: a pretrained model on the CPU trains under one
// sample a second, a small one thousands.
std::string rate(double per_s) {
  if (per_s >= 100) return fmt::format("{:.0f}", per_s);
  if (per_s >= 10) return fmt::format("{:.1f}", per_s);
  return fmt::format("{:.2f}", per_s);
}

}  // namespace

void Progress::on_step(const core::StepRecord& r) {
  ++trained_steps_;
  trained_samples_ += r.samples;
  if (terminal_) {
    // Redraw at most ~10 times a second.
    const auto now = std::chrono::steady_clock::now();
    if (r.step != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * r.step / std::max<int64_t>(1, total_));
    const double eta = r.time_s / static_cast<double>(r.step) * static_cast<double>(total_ - r.step);
    fmt::print(out_, "\r[{:=<{}}{: <{}}] {}/{} loss {:.4f} lr {:.2e} |g| {:.3f} {} samples/s eta {:.0f}s ", "", filled,
               "", kWidth - filled, r.step, total_, r.loss, r.lr, r.grad_norm, rate(r.samples_per_s), eta);
    if (r.step == total_) fmt::print(out_, "\n");
  } else if (r.step % interval_ == 0 || r.step == total_) {
    fmt::print(out_, "step {}/{} epoch {} loss {:.4f} lr {:.3e} grad_norm {:.4f} {} samples/s\n", r.step, total_,
               r.epoch, r.loss, r.lr, r.grad_norm, rate(r.samples_per_s));
  }
  std::fflush(out_);
}

void Progress::on_eval(const core::EvalRecord& r) {
  if (terminal_) fmt::print(out_, "\n");
  fmt::print(out_, "eval at step {}: loss {:.4f}", r.step, r.loss);
  if (!std::isnan(r.accuracy)) fmt::print(out_, ", accuracy {:.4f}", r.accuracy);
  fmt::print(out_, " ({} samples, {:.1f} s)\n", r.samples, r.time_s);
  std::fflush(out_);
}

void Progress::on_end(const core::TrainSummary& s) {
  if (trained_steps_ == 0) {
    // Resumed at the last step: nothing was trained here, so there is no rate to show.
    fmt::print(out_,
               "done: {} steps, {} samples (all trained before the checkpoint this run resumed), train loss {:.4f}\n",
               s.steps, s.samples, s.train_loss);
  } else {
    fmt::print(out_, "done: {} steps, {} samples in {:.1f} s ({} samples/s), train loss {:.4f}\n", s.steps, s.samples,
               s.wall_s, rate(static_cast<double>(trained_samples_) / s.wall_s), s.train_loss);
  }
  if (s.has_eval && !std::isnan(s.eval.accuracy)) {
    fmt::print(out_, "{} accuracy: {:.2f}% ({} samples)\n", eval_split_, 100.0 * s.eval.accuracy, s.eval.samples);
  }
  std::fflush(out_);
}

}  // namespace gradaccum::run
