#include "gradaccum/report/html_report.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "gradaccum/base/check.h"
#include "gradaccum/base/files.h"

namespace gradaccum::report {

namespace {

namespace fs = std::filesystem;

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string base64(const std::string& bytes) {
  static constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t a = static_cast<unsigned char>(bytes[i]);
    const uint32_t b = i + 1 < bytes.size() ? static_cast<unsigned char>(bytes[i + 1]) : 0;
    const uint32_t c = i + 2 < bytes.size() ? static_cast<unsigned char>(bytes[i + 2]) : 0;
    const uint32_t triple = (a << 16) | (b << 8) | c;
    out += kDigits[(triple >> 18) & 63];
    out += kDigits[(triple >> 12) & 63];
    out += i + 1 < bytes.size() ? kDigits[(triple >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kDigits[triple & 63] : '=';
  }
  return out;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  GA_CHECK(in.good(), "{}: cannot read", path.string());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

std::string number_text(double v) {
  if (!std::isfinite(v)) return "–";
  if (v == std::floor(v) && std::abs(v) < 1e15) return fmt::format("{:.0f}", v);
  return fmt::format("{:.6g}", v);
}

std::string json_text(const nlohmann::json& v) {
  if (v.is_number()) return number_text(v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

// b, N and W from summary.json, else from config.yaml (a run still going or preempted).
struct Decomposition {
  int64_t micro_batch = 0, accumulation = 0, world = 1;
};

Decomposition decomposition(const RunFiles& run) {
  Decomposition d;
  if (run.summary.is_object() && run.summary.contains("micro_batch")) {
    d.micro_batch = run.summary.value("micro_batch", int64_t{0});
    d.accumulation = run.summary.value("gradient_accumulation_steps", int64_t{0});
    d.world = run.summary.value("world_size", int64_t{1});
    return d;
  }
  if (!run.config_yaml.empty()) {
    try {
      const auto config = YAML::Load(run.config_yaml);
      if (config["per_device_train_batch_size"]) d.micro_batch = config["per_device_train_batch_size"].as<int64_t>();
      if (config["gradient_accumulation_steps"]) d.accumulation = config["gradient_accumulation_steps"].as<int64_t>();
    } catch (const YAML::Exception&) {
      // A config.yaml that does not parse leaves the decomposition unknown; the page still shows it.
    }
  }
  for (const auto& s : run.steps) d.world = std::max<int64_t>(d.world, static_cast<int64_t>(s.rank_items.size()));
  return d;
}

void decomposition_section(const RunFiles& run, std::string& html) {
  const auto d = decomposition(run);
  const char* unit = run.items_are_tokens ? "tokens" : "samples";
  html += "<h2>Decomposition</h2>\n<table class=\"kv\">\n";
  if (d.micro_batch > 0 && d.accumulation > 0) {
    html += fmt::format(
        "<tr><th>micro-batch b × accumulation N × world W</th><td>{} × {} × {} = global batch <b>{}</b> samples "
        "per optimizer step</td></tr>\n",
        d.micro_batch, d.accumulation, d.world, d.micro_batch * d.accumulation * d.world);
  }
  if (!run.steps.empty()) {
    std::vector<double> items;
    for (const auto& s : run.steps) items.push_back(s.items);
    const auto [low, high] = std::minmax_element(items.begin(), items.end());
    const double mean = std::accumulate(items.begin(), items.end(), 0.0) / static_cast<double>(items.size());
    html +=
        fmt::format("<tr><th>{} per window (the loss normalizer)</th><td>mean {}, smallest {}, largest {}</td></tr>\n",
                    unit, number_text(mean), number_text(*low), number_text(*high));
    const auto& normalization = run.steps.back().loss_normalization;
    if (!normalization.empty()) {
      html += fmt::format("<tr><th>loss normalization</th><td>{}</td></tr>\n", escape(normalization));
    }
  }
  html += "</table>\n";
}

void summary_section(const RunFiles& run, std::string& html) {
  if (!run.summary.is_object()) {
    html += "<p>No summary.json: the run has not finished (or was stopped).</p>\n";
    return;
  }
  html += "<h2>Summary</h2>\n<table class=\"kv\">\n";
  for (const auto& [key, value] : run.summary.items()) {
    html += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", escape(key), escape(json_text(value)));
  }
  html += "</table>\n";
}

std::string list_text(const std::vector<double>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + number_text(values[i]);
  return out;
}

void accounting_section(const RunFiles& run, std::string& html) {
  if (run.steps.empty()) return;
  const char* unit = run.items_are_tokens ? "tokens" : "samples";
  html += fmt::format(
      "<h2>Per-window accounting</h2>\n<p>Each optimizer step's window: its {} (the normalizer of its "
      "gradient), the {} of each micro-step summed over ranks, and each rank's share. The first and last "
      "ten steps are listed.</p>\n<table class=\"grid\">\n<tr><th>step</th><th>{}</th><th>micro-steps</th>"
      "<th>each micro-step</th><th>each rank</th><th>normalization</th><th>loss</th><th>grad norm</th></tr>\n",
      unit, unit, unit);
  for (size_t i = 0; i < run.steps.size(); ++i) {
    if (i == 10 && run.steps.size() > 20) {
      html += fmt::format("<tr><td colspan=\"8\">… {} steps …</td></tr>\n", run.steps.size() - 20);
      i = run.steps.size() - 10;
    }
    const auto& s = run.steps[i];
    html += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n", s.step,
        number_text(s.items), s.micro_step_items.size(), list_text(s.micro_step_items), list_text(s.rank_items),
        escape(s.loss_normalization), number_text(s.loss), number_text(s.grad_norm));
  }
  html += "</table>\n";
}

void verify_section(const VerifyRun& verify, std::string& html) {
  html += fmt::format(
      "<h2>Verification</h2>\n<p>{} steps in float64, global batch {}, tolerance {:.0e}: <b>{}</b>.</p>\n"
      "<table class=\"grid\">\n<tr><th>split (b×N)</th><th>max relative loss</th><th>max relative grad "
      "norm</th><th>relative weights</th></tr>\n",
      verify.steps, verify.global_batch, verify.tolerance,
      verify.exact ? "every split follows the reference" : "NOT exact");
  for (size_t k = 0; k < verify.splits.size(); ++k) {
    const auto& s = verify.splits[k];
    if (k == 0) {
      html += fmt::format("<tr><td>{}</td><td colspan=\"3\">reference</td></tr>\n", escape(s.split));
    } else {
      html += fmt::format("<tr><td>{}</td><td>{:.3e}</td><td>{:.3e}</td><td>{:.3e}</td></tr>\n", escape(s.split),
                          s.max_relative_loss, s.max_relative_grad_norm, s.relative_weights);
    }
  }
  html += "</table>\n";
}

constexpr const char* kStyle = R"(<style>
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1640px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 14px; }
table.kv th { text-align: left; padding: 3px 14px 3px 0; font-weight: normal; color: #555; }
table.grid th, table.grid td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
figure { margin: 18px 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 14px; color: #444; }
pre { background: #f6f6f6; padding: 10px; font-size: 13px; overflow-x: auto; }
</style>
)";

// Counts the figures the browser decoded, once every image has settled.
constexpr const char* kScript = R"(<script>
window.addEventListener('load', function () {
  var images = document.querySelectorAll('img.figure');
  var shown = 0;
  images.forEach(function (img) { if (img.complete && img.naturalWidth > 0) shown += 1; });
  document.body.setAttribute('data-figures-shown', shown + '/' + images.length);
  document.getElementById('figures-shown').textContent = shown + ' of ' + images.length + ' figures shown';
});
</script>
)";

}  // namespace

std::string html_report(const RunFiles& run, const std::vector<FigureFile>& figures,
                        const std::string& figure_directory) {
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += fmt::format("<title>gradaccum run {}</title>\n", escape(run.directory));
  html += kStyle;
  html += kScript;
  html += "</head>\n<body data-figures-shown=\"\">\n";
  html += fmt::format("<h1>gradaccum run <code>{}</code></h1>\n", escape(run.directory));
  html += "<p id=\"figures-shown\"></p>\n";
  if (!run.steps.empty()) {
    const auto& last = run.steps.back();
    html += fmt::format("<p>{} optimizer steps logged; last step {}: loss {}, learning rate {}.</p>\n",
                        run.steps.size(), last.step, number_text(last.loss), number_text(last.lr));
  }
  decomposition_section(run, html);
  if (run.verify) verify_section(*run.verify, html);
  summary_section(run, html);
  html += "<h2>Figures</h2>\n";
  for (const auto& f : figures) {
    const auto png = read_bytes(fs::path(figure_directory) / f.file);
    html += fmt::format(
        "<figure><img class=\"figure\" alt=\"{}\" width=\"{}\" height=\"{}\" src=\"data:image/png;base64,{}\">"
        "<figcaption>{} ({})</figcaption></figure>\n",
        escape(f.file), f.width, f.height, base64(png), escape(f.caption), escape(f.file));
  }
  accounting_section(run, html);
  if (!run.config_yaml.empty()) {
    html += "<h2>Configuration (config.yaml)</h2>\n<pre>" + escape(run.config_yaml) + "</pre>\n";
  }
  html += "</body>\n</html>\n";
  return html;
}

std::vector<FigureFile> write_report(const RunFiles& run, const std::string& figure_directory,
                                     const std::string& report_path) {
  auto figures = write_run_figures(run, figure_directory);
  const auto html = html_report(run, figures, figure_directory);
  base::write_file_atomically(report_path, html);
  return figures;
}

}  // namespace gradaccum::report
