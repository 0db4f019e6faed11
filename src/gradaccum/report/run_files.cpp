#include "gradaccum/report/run_files.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "gradaccum/base/check.h"

namespace gradaccum::report {

namespace {

namespace fs = std::filesystem;
constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();

// A number of a record, NaN when absent or null (metrics.jsonl writes NaN losses as null).
double number(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : kMissing;
}

std::vector<double> numbers(const nlohmann::json& j, const char* key) {
  std::vector<double> values;
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return values;
  for (const auto& v : *it) values.push_back(v.is_number() ? v.get<double>() : kMissing);
  return values;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Calls `each(json, line_number)` for every line of a JSON-lines file.
template <class F>
void for_each_record(const fs::path& path, F each) {
  std::ifstream in(path);
  GA_CHECK(in.good(), "{}: cannot read", path.string());
  int64_t line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    GA_CHECK(j.is_object() && j.contains("step") && j["step"].is_number_integer(),
             "{}:{}: not a gradaccum record (a JSON object with an integer \"step\")", path.string(), line_number);
    each(j, line_number);
  }
}

void read_metrics(const fs::path& path, RunFiles& run) {
  for_each_record(path, [&](const nlohmann::json& j, int64_t) {
    const auto step = j["step"].get<int64_t>();
    if (j.contains("eval_loss")) {
      run.evals.push_back({step, number(j, "eval_loss")});
      return;
    }
    StepPoint p;
    p.step = step;
    p.loss = number(j, "loss");
    p.lr = number(j, "lr");
    p.grad_norm = number(j, "grad_norm");
    p.grad_norm_clipped = number(j, "grad_norm_clipped");
    p.items = number(j, "items");
    p.items_per_s = number(j, "items_per_s");
    p.loss_scale = j.contains("loss_scale") ? number(j, "loss_scale") : 0.0;
    p.skipped = j.value("skipped", false);
    p.micro_step_items = numbers(j, "micro_step_items");
    p.rank_items = numbers(j, "rank_items");
    p.loss_normalization = j.value("loss_normalization", std::string());
    if (j.contains("tokens_per_s")) run.items_are_tokens = true;
    run.steps.push_back(std::move(p));
  });
}

void read_grad_flow(const fs::path& path, RunFiles& run) {
  for_each_record(path, [&](const nlohmann::json& j, int64_t line_number) {
    GradFlowPoint p;
    p.step = j["step"].get<int64_t>();
    const auto it = j.find("parameters");
    GA_CHECK(it != j.end() && it->is_array(), "{}:{}: no \"parameters\" array", path.string(), line_number);
    for (const auto& parameter : *it) {
      GA_CHECK(parameter.is_object() && parameter.contains("name") && parameter["name"].is_string(),
               "{}:{}: a parameter without a \"name\"", path.string(), line_number);
      p.names.push_back(parameter["name"].get<std::string>());
      p.mean_abs.push_back(number(parameter, "mean_abs"));
      p.max_abs.push_back(number(parameter, "max_abs"));
      p.zero_fraction.push_back(number(parameter, "zero_fraction"));
    }
    run.grad_flow.push_back(std::move(p));
  });
}

VerifyRun read_verify(const fs::path& path) {
  const auto j = nlohmann::json::parse(read_text(path), nullptr, /*allow_exceptions=*/false);
  GA_CHECK(j.is_object() && j.contains("splits") && j["splits"].is_array() && !j["splits"].empty(),
           "{}: not a gradaccum verify record (a JSON object with a \"splits\" array)", path.string());
  VerifyRun run;
  run.steps = j.value("steps", int64_t{0});
  run.global_batch = j.value("global_batch", int64_t{0});
  run.tolerance = j.value("tolerance", 0.0);
  run.exact = j.value("exact", false);
  for (const auto& s : j["splits"]) {
    GA_CHECK(s.is_object() && s.contains("split") && s["split"].is_string(), "{}: a split without its \"split\" name",
             path.string());
    VerifySplit split;
    split.split = s["split"].get<std::string>();
    split.loss = numbers(s, "loss");
    split.grad_norm = numbers(s, "grad_norm");
    split.max_relative_loss = s.value("max_relative_loss", 0.0);
    split.max_relative_grad_norm = s.value("max_relative_grad_norm", 0.0);
    split.relative_weights = s.value("relative_weights", 0.0);
    run.splits.push_back(std::move(split));
  }
  return run;
}

}  // namespace

RunFiles read_run_files(const std::string& directory) {
  const fs::path dir(directory);
  GA_CHECK(fs::is_directory(dir), "{}: not a directory", directory);
  const auto metrics = dir / "metrics.jsonl";
  const auto verify = dir / "verify.json";
  GA_CHECK(fs::exists(metrics) || fs::exists(verify),
           "{}: no metrics.jsonl (nor verify.json): not the output_dir of `gradaccum train` or of "
           "`gradaccum verify --output-dir`",
           directory);
  RunFiles run;
  run.directory = directory;
  if (fs::exists(metrics)) read_metrics(metrics, run);
  if (fs::exists(dir / "grad_flow.jsonl")) read_grad_flow(dir / "grad_flow.jsonl", run);
  if (fs::exists(verify)) run.verify = read_verify(verify);
  if (fs::exists(dir / "summary.json")) {
    run.summary = nlohmann::json::parse(read_text(dir / "summary.json"), nullptr, /*allow_exceptions=*/false);
    GA_CHECK(run.summary.is_object(), "{}: not a JSON object", (dir / "summary.json").string());
  }
  if (fs::exists(dir / "config.yaml")) run.config_yaml = read_text(dir / "config.yaml");
  return run;
}

std::string to_json_text(const VerifyRun& run) {
  nlohmann::json splits = nlohmann::json::array();
  for (const auto& s : run.splits) {
    splits.push_back({{"split", s.split},
                      {"loss", s.loss},
                      {"grad_norm", s.grad_norm},
                      {"max_relative_loss", s.max_relative_loss},
                      {"max_relative_grad_norm", s.max_relative_grad_norm},
                      {"relative_weights", s.relative_weights}});
  }
  const nlohmann::json j = {{"steps", run.steps},
                            {"global_batch", run.global_batch},
                            {"tolerance", run.tolerance},
                            {"exact", run.exact},
                            {"splits", splits}};
  return j.dump(2) + "\n";
}

}  // namespace gradaccum::report
