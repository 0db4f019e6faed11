#include "gradaccum/report/run_figures.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>

#include "gradaccum/base/check.h"
#include "gradaccum/report/figure.h"

namespace gradaccum::report {

namespace {

namespace fs = std::filesystem;

Series series(std::string label, std::vector<double> x, std::vector<double> y, size_t colour,
              SeriesStyle style = SeriesStyle::line) {
  return {std::move(label), std::move(x), std::move(y), series_colour(colour), style};
}

std::vector<double> steps_of(const RunFiles& run) {
  std::vector<double> x;
  for (const auto& p : run.steps) x.push_back(static_cast<double>(p.step));
  return x;
}

template <class F>
std::vector<double> column(const RunFiles& run, F field) {
  std::vector<double> y;
  for (const auto& p : run.steps) y.push_back(field(p));
  return y;
}

Panel titled(std::string title, std::string x_label, std::string y_label) {
  Panel p;
  p.title = std::move(title);
  p.x_label = std::move(x_label);
  p.y_label = std::move(y_label);
  return p;
}

Figure single(Panel panel) {
  Figure f;
  f.panels.push_back(std::move(panel));
  return f;
}

Figure loss_figure(const RunFiles& run) {
  Panel p = titled("Loss per optimizer step", "optimizer step", "loss");
  p.series.push_back(series("train", steps_of(run), column(run, [](const StepPoint& s) { return s.loss; }), 0));
  if (!run.evals.empty()) {
    std::vector<double> x, y;
    for (const auto& e : run.evals) {
      x.push_back(static_cast<double>(e.step));
      y.push_back(e.loss);
    }
    p.series.push_back(series("eval", x, y, 1, SeriesStyle::line_and_points));
  }
  return single(std::move(p));
}

Figure lr_figure(const RunFiles& run) {
  Panel p = titled("Learning rate (the schedule counts optimizer steps)", "optimizer step", "learning rate");
  p.series.push_back(series("", steps_of(run), column(run, [](const StepPoint& s) { return s.lr; }), 0));
  return single(std::move(p));
}

Figure grad_norm_figure(const RunFiles& run) {
  Panel p = titled("Gradient norm of each window's normalized gradient", "optimizer step", "L2 norm");
  p.log_y = true;
  p.series.push_back(
      series("before clipping", steps_of(run), column(run, [](const StepPoint& s) { return s.grad_norm; }), 0));
  p.series.push_back(series("after clipping", steps_of(run),
                            column(run, [](const StepPoint& s) { return s.grad_norm_clipped; }), 1,
                            SeriesStyle::dashed_line));
  return single(std::move(p));
}

Figure throughput_figure(const RunFiles& run) {
  const char* unit = run.items_are_tokens ? "tokens/s" : "samples/s";
  Panel p = titled(fmt::format("Throughput ({} of each optimizer step)", unit), "optimizer step", unit);
  p.series.push_back(series("", steps_of(run), column(run, [](const StepPoint& s) { return s.items_per_s; }), 0));
  return single(std::move(p));
}

Figure window_items_figure(const RunFiles& run) {
  const char* unit = run.items_are_tokens ? "tokens" : "samples";
  Figure f;
  f.rows = 2;
  Panel window = titled(fmt::format("Items of each window: the loss normalizer ({})", unit), "optimizer step", unit);
  window.series.push_back(series("window", steps_of(run), column(run, [](const StepPoint& s) { return s.items; }), 0));
  f.panels.push_back(std::move(window));

  Panel micro = titled(fmt::format("Items of each micro-step ({}, summed over ranks)", unit), "optimizer step", unit);
  const auto stat = [](const std::vector<double>& v, int which) {
    if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
    if (which < 0) return *std::min_element(v.begin(), v.end());
    if (which > 0) return *std::max_element(v.begin(), v.end());
    return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  };
  micro.series.push_back(series("smallest micro-step", steps_of(run),
                                column(run, [&](const StepPoint& s) { return stat(s.micro_step_items, -1); }), 1,
                                SeriesStyle::dashed_line));
  micro.series.push_back(
      series("mean", steps_of(run), column(run, [&](const StepPoint& s) { return stat(s.micro_step_items, 0); }), 0));
  micro.series.push_back(series("largest micro-step", steps_of(run),
                                column(run, [&](const StepPoint& s) { return stat(s.micro_step_items, 1); }), 2,
                                SeriesStyle::dashed_line));
  size_t ranks = 0;
  for (const auto& s : run.steps) ranks = std::max(ranks, s.rank_items.size());
  for (size_t r = 0; r < std::min<size_t>(ranks, 7); ++r) {
    micro.series.push_back(series(fmt::format("rank {} (whole window)", r), steps_of(run),
                                  column(run,
                                         [&](const StepPoint& s) {
                                           return r < s.rank_items.size() ? s.rank_items[r]
                                                                          : std::numeric_limits<double>::quiet_NaN();
                                         }),
                                  3 + r, SeriesStyle::dashed_line));
  }
  f.panels.push_back(std::move(micro));
  return f;
}

// At most `count` logged steps, evenly spaced, first and last included.
std::vector<size_t> sampled(size_t size, size_t count) {
  std::vector<size_t> picks;
  if (size <= count) {
    picks.resize(size);
    std::iota(picks.begin(), picks.end(), 0);
    return picks;
  }
  for (size_t k = 0; k < count; ++k) picks.push_back(k * (size - 1) / (count - 1));
  picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
  return picks;
}

Figure grad_flow_figure(const RunFiles& run) {
  Figure f;
  f.width = 1600;
  f.height = 1000;
  Panel p = titled("Gradient flow: mean |grad| (solid) and max |grad| (dashed) per parameter tensor", "",
                   "|grad| before clipping");
  p.log_y = true;
  const auto& last = run.grad_flow.back();
  // The names without their common dotted prefix ("transformer."), which the note names.
  size_t prefix = last.names.front().rfind('.') == std::string::npos ? 0 : last.names.front().rfind('.') + 1;
  for (const auto& name : last.names) {
    prefix = std::min(prefix, name.size());
    while (prefix > 0 && (name.compare(0, prefix, last.names.front(), 0, prefix) != 0 || name[prefix - 1] != '.')) {
      --prefix;
    }
  }
  for (const auto& name : last.names) p.x_categories.push_back(name.substr(prefix));
  if (prefix > 0)
    p.note = fmt::format("parameter names without their common prefix \"{}\"", last.names.front().substr(0, prefix));
  std::vector<double> x(last.names.size());
  std::iota(x.begin(), x.end(), 0.0);
  const auto picks = sampled(run.grad_flow.size(), 6);
  for (size_t k = 0; k < picks.size(); ++k) {
    const auto& g = run.grad_flow[picks[k]];
    GA_CHECK(g.names == last.names, "{}/grad_flow.jsonl: step {} lists other parameters than step {}", run.directory,
             g.step, last.step);
    p.series.push_back(series(fmt::format("step {}", g.step), x, g.mean_abs, k));
    p.series.push_back(series("", x, g.max_abs, k, SeriesStyle::dashed_line));  // listed with its mean
  }
  f.panels.push_back(std::move(p));
  return f;
}

std::vector<double> relative_difference(const std::vector<double>& a, const std::vector<double>& reference) {
  std::vector<double> d;
  for (size_t i = 0; i < std::min(a.size(), reference.size()); ++i) {
    // Equal values have no place on a log axis; 1e-17 (below float64's resolution) stands for 0.
    const double r = std::abs(a[i] - reference[i]) / std::max(std::abs(reference[i]), 1e-300);
    d.push_back(std::max(r, 1e-17));
  }
  return d;
}

Figure verify_figure(const VerifyRun& verify) {
  Figure f;
  f.width = 1600;
  f.height = 1000;
  f.rows = 2;
  f.columns = 2;
  f.title = fmt::format("gradaccum verify: {} steps in float64, global batch {}: {}", verify.steps, verify.global_batch,
                        verify.exact ? "exact" : "NOT exact");
  Panel loss = titled("Loss per step, each split", "optimizer step", "loss");
  Panel norm = titled("Gradient norm per step, each split", "optimizer step", "L2 norm");
  Panel loss_diff = titled("Loss: relative difference from the reference", "optimizer step", "relative difference");
  Panel norm_diff =
      titled("Gradient norm: relative difference from the reference", "optimizer step", "relative difference");
  loss_diff.log_y = norm_diff.log_y = true;
  const auto& reference = verify.splits.front();
  double worst_loss = 0.0, worst_norm = 0.0;
  for (size_t k = 0; k < verify.splits.size(); ++k) {
    const auto& s = verify.splits[k];
    std::vector<double> x(s.loss.size());
    std::iota(x.begin(), x.end(), 1.0);
    const auto style = k == 0 ? SeriesStyle::line : (k % 2 ? SeriesStyle::dashed_line : SeriesStyle::points);
    const std::string label = k == 0 ? s.split + " (reference)" : s.split;
    loss.series.push_back(series(label, x, s.loss, k, style));
    norm.series.push_back(series(label, x, s.grad_norm, k, style));
    if (k == 0) continue;
    worst_loss = std::max(worst_loss, s.max_relative_loss);
    worst_norm = std::max(worst_norm, s.max_relative_grad_norm);
    loss_diff.series.push_back(series(fmt::format("{}: max {:.2e}", s.split, s.max_relative_loss), x,
                                      relative_difference(s.loss, reference.loss), k, SeriesStyle::line_and_points));
    norm_diff.series.push_back(series(fmt::format("{}: max {:.2e}", s.split, s.max_relative_grad_norm), x,
                                      relative_difference(s.grad_norm, reference.grad_norm), k,
                                      SeriesStyle::line_and_points));
  }
  loss.note = fmt::format("largest relative difference {:.2e} (tolerance {:.0e})", worst_loss, verify.tolerance);
  norm.note = fmt::format("largest relative difference {:.2e} (tolerance {:.0e})", worst_norm, verify.tolerance);
  loss_diff.note = norm_diff.note = fmt::format("reference {}; equal values are drawn at 1e-17", reference.split);
  f.panels = {std::move(loss), std::move(norm), std::move(loss_diff), std::move(norm_diff)};
  return f;
}

}  // namespace

std::vector<FigureFile> write_run_figures(const RunFiles& run, const std::string& directory) {
  std::error_code error;
  fs::create_directories(directory, error);
  GA_CHECK(fs::is_directory(directory), "{}: cannot create the figures' directory", directory);
  std::vector<FigureFile> files;
  auto write = [&](const std::string& file, const std::string& caption, const Figure& figure) {
    write_png(figure, (fs::path(directory) / file).string());
    files.push_back({file, caption, figure.width, figure.height});
  };
  if (!run.steps.empty()) {
    write("loss.png", "Training loss of each optimizer step (the window's mean over its items) and evaluation loss.",
          loss_figure(run));
    write("lr.png", "Learning rate at each optimizer step.", lr_figure(run));
    write("grad_norm.png", "L2 norm of the accumulated, normalized gradient before and after clipping.",
          grad_norm_figure(run));
    write("throughput.png", "Throughput of each optimizer step (its items over its wall time).",
          throughput_figure(run));
    write("window_items.png",
          "Per-window accounting: the window's normalizer, and the items of its micro-steps (and ranks).",
          window_items_figure(run));
  }
  if (!run.grad_flow.empty()) {
    write("grad_flow.png",
          "Gradient flow (seed 002's chart): mean and max |grad| of each parameter tensor, per logged step.",
          grad_flow_figure(run));
  }
  if (run.verify) {
    write("verify.png", "gradaccum verify: each split's trajectory against the reference split's.",
          verify_figure(*run.verify));
  }
  return files;
}

}  // namespace gradaccum::report
