// Figures and the run report (report/): `train --plots`, `verify --plots` and `gradaccum plot`
// write every documented PNG at its documented size with something drawn in it, report.html
// carries the run's numbers, bad run directories are one-line errors, and headless Chromium
// shows the report with every figure decoded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "gradaccum/report/html_report.h"
#include "gradaccum/report/run_files.h"
#include "png_pixels.h"
#include "test_support.h"

namespace report_test {

namespace fs = std::filesystem;
using gradaccum::testing::make_temp_dir;
using gradaccum::testing::read_jsonl;
using gradaccum::testing::read_png;
using gradaccum::testing::read_text;
using gradaccum::testing::run_cli;

// The first series colour of every figure (report/figure.h's palette).
constexpr int kBlue[3] = {31, 119, 180};

const std::string kSmallCnn =
    "--set model.type=cnn --set model.norm=group --set model.channels=[4,8] --set model.hidden=[16] "
    "--set dtype=float64 --set data.train_limit=640 --set data.eval_limit=200 --set max_steps=6 "
    "--set threads=1 --set learning_rate=3e-3 --set warmup_steps=2 --set per_device_train_batch_size=8 "
    "--set gradient_accumulation_steps=2 --set eval_steps=3 --set grad_flow_steps=2 --set logging_steps=1";

// The documented figures (report/run_figures.h) and their sizes.
const std::map<std::string, std::pair<int, int>> kTrainFigures = {
    {"loss.png", {1200, 800}},       {"lr.png", {1200, 800}},           {"grad_norm.png", {1200, 800}},
    {"throughput.png", {1200, 800}}, {"window_items.png", {1200, 800}}, {"grad_flow.png", {1600, 1000}}};

void expect_drawn_figure(const std::string& path, int width, int height) {
  SCOPED_TRACE(path);
  ASSERT_TRUE(fs::exists(path));
  const auto png = read_png(path);
  EXPECT_EQ(png.width, width);
  EXPECT_EQ(png.height, height);
  EXPECT_EQ(png.at(0, 0), 0xFFFFFFu) << "white background";
  // Axes, text and at least one series: many colours (antialiasing), a few percent of the page.
  EXPECT_GE(png.distinct_colours(), 20u);
  EXPECT_GT(png.foreground_fraction(), 0.01);
  EXPECT_LT(png.foreground_fraction(), 0.5);
  // The first series: a line of about 2 pixels across a panel (in verify.png partly covered by
  // the splits drawn over it).
  EXPECT_GT(png.count_colour(kBlue[0], kBlue[1], kBlue[2], 12), 200u) << "the first series is drawn";
}

// A run of two ranks, so that the report has each rank's share to show.
struct PlottedRun {
  std::string dir;
  gradaccum::testing::CliResult result;
};

const PlottedRun& plotted_run() {
  static const PlottedRun run = [] {
    PlottedRun r;
    r.dir = make_temp_dir("report-run") + "/out";
    r.result = run_cli("train " + kSmallCnn + " --nproc 2 --plots --set output_dir=" + r.dir);
    return r;
  }();
  return run;
}

TEST(ReportFigures, TrainPlotsWritesEveryFigureAtItsDocumentedSize) {
  const auto& run = plotted_run();
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  EXPECT_NE(run.result.out.find("plots: 6 figures in " + run.dir + "/plots; report: " + run.dir + "/report.html"),
            std::string::npos)
      << run.result.out;
  for (const auto& [file, size] : kTrainFigures) {
    expect_drawn_figure(run.dir + "/plots/" + file, size.first, size.second);
  }
  EXPECT_FALSE(fs::exists(run.dir + "/plots/verify.png")) << "a training run has no verify figure";
  for (const auto& entry : fs::directory_iterator(run.dir + "/plots")) {
    EXPECT_EQ(entry.path().extension(), ".png") << "no temporary file is left: " << entry.path();
  }
}

TEST(ReportFigures, ReadBackRunFilesEqualTheRunsRecords) {
  const auto& run = plotted_run();
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const auto files = gradaccum::report::read_run_files(run.dir);
  const auto lines = read_jsonl(run.dir + "/metrics.jsonl");
  size_t steps = 0, evals = 0;
  for (const auto& j : lines) {
    if (j.contains("eval_loss")) {
      ASSERT_LT(evals, files.evals.size());
      EXPECT_EQ(files.evals[evals].step, j["step"].get<int64_t>());
      EXPECT_DOUBLE_EQ(files.evals[evals].loss, j["eval_loss"].get<double>());
      ++evals;
      continue;
    }
    ASSERT_LT(steps, files.steps.size());
    const auto& s = files.steps[steps++];
    EXPECT_EQ(s.step, j["step"].get<int64_t>());
    EXPECT_DOUBLE_EQ(s.loss, j["loss"].get<double>());
    EXPECT_DOUBLE_EQ(s.grad_norm, j["grad_norm"].get<double>());
    EXPECT_DOUBLE_EQ(s.items, j["items"].get<double>());
    EXPECT_EQ(s.micro_step_items, j["micro_step_items"].get<std::vector<double>>());
    EXPECT_EQ(s.rank_items, j["rank_items"].get<std::vector<double>>());
  }
  EXPECT_EQ(steps, 6u);
  EXPECT_EQ(evals, 2u);  // steps 3 and 6
  EXPECT_EQ(files.steps.size(), steps);
  // Two ranks of b = 8, N = 2: a window of 32 samples, micro-steps of 16 (8 per rank), 16 per rank.
  EXPECT_EQ(files.steps[0].micro_step_items, (std::vector<double>{16, 16}));
  EXPECT_EQ(files.steps[0].rank_items, (std::vector<double>{16, 16}));
  ASSERT_EQ(files.grad_flow.size(), 3u);  // steps 2, 4, 6
  EXPECT_EQ(files.grad_flow[2].step, 6);
  EXPECT_EQ(files.grad_flow[2].names.front(), "conv0.weight");
  EXPECT_EQ(files.summary["global_batch_size"].get<int64_t>(), 32);
}

TEST(ReportFigures, ReportCarriesTheDecompositionAndEachWindowsAccounting) {
  const auto& run = plotted_run();
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const auto html = read_text(run.dir + "/report.html");
  EXPECT_NE(html.find("8 × 2 × 2 = global batch <b>32</b> samples per optimizer step"), std::string::npos);
  EXPECT_NE(html.find("<tr><th>samples per window (the loss normalizer)</th><td>mean 32, smallest 32, largest 32"),
            std::string::npos);
  for (const auto& j : read_jsonl(run.dir + "/metrics.jsonl")) {
    if (j.contains("eval_loss")) continue;
    // step | items | micro-steps | each micro-step | each rank | normalization
    const std::string row = fmt::format("<tr><td>{}</td><td>32</td><td>2</td><td>16, 16</td><td>16, 16</td><td>{}</td>",
                                        j["step"].get<int64_t>(), j["loss_normalization"].get<std::string>());
    EXPECT_NE(html.find(row), std::string::npos) << row;
  }
  EXPECT_NE(html.find("<pre>"), std::string::npos) << "the configuration";
  // Every figure embedded as a data: URI (the page stands alone).
  size_t images = 0;
  for (size_t at = html.find("src=\"data:image/png;base64,"); at != std::string::npos;
       at = html.find("src=\"data:image/png;base64,", at + 1)) {
    ++images;
  }
  EXPECT_EQ(images, kTrainFigures.size());
}

TEST(ReportFigures, PlotCommandRedrawsIntoAnotherDirectory) {
  const auto& run = plotted_run();
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const auto out = make_temp_dir("report-out") + "/figures";
  const auto r = run_cli("plot " + run.dir + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& [file, size] : kTrainFigures) expect_drawn_figure(out + "/" + file, size.first, size.second);
  EXPECT_TRUE(fs::exists(out + "/report.html"));
}

TEST(ReportFigures, VerifyPlotsOverlaysEverySplitWithItsLargestDifference) {
  const auto dir = make_temp_dir("report-verify") + "/verify";
  const auto r = run_cli(
      "verify --set model.channels=[4,8] --set model.hidden=[16] --set data.train_limit=256 --set threads=1 "
      "--steps 3 --splits 32x1,8x4,2x16 --output-dir " +
      dir + " --plots");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto verify = gradaccum::report::read_run_files(dir).verify;
  ASSERT_TRUE(verify.has_value());
  ASSERT_EQ(verify->splits.size(), 3u);
  EXPECT_TRUE(verify->exact);
  EXPECT_EQ(verify->global_batch, 32);
  EXPECT_EQ(verify->splits[1].split, "8x4");
  for (const auto& s : verify->splits) {
    ASSERT_EQ(s.loss.size(), 3u);
    ASSERT_EQ(s.grad_norm.size(), 3u);
    EXPECT_LE(s.max_relative_loss, 1e-10);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_NEAR(s.loss[i], verify->splits[0].loss[i], 1e-10 * std::abs(verify->splits[0].loss[i]));
    }
  }
  // The printed table and the file hold the same largest difference.
  EXPECT_NE(r.out.find(fmt::format("{:>14.3e}", verify->splits[2].max_relative_loss)), std::string::npos) << r.out;
  expect_drawn_figure(dir + "/plots/verify.png", 1600, 1000);
  const auto html = read_text(dir + "/report.html");
  EXPECT_NE(html.find(fmt::format("<tr><td>2x16</td><td>{:.3e}</td>", verify->splits[2].max_relative_loss)),
            std::string::npos);
}

TEST(ReportErrors, ADirectoryWithoutMetricsIsAOneLineError) {
  const auto dir = make_temp_dir("report-empty");
  const auto r = run_cli("plot " + dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "gradaccum: error: " + dir +
                       ": no metrics.jsonl (nor verify.json): not the output_dir of `gradaccum train` or of "
                       "`gradaccum verify --output-dir`\n");
  EXPECT_FALSE(fs::exists(dir + "/plots"));
  EXPECT_FALSE(fs::exists(dir + "/report.html"));

  const auto missing = run_cli("plot " + dir + "/nothing-here");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.err, "gradaccum: error: " + dir + "/nothing-here: not a directory\n");

  const auto no_out = run_cli("verify --plots");
  EXPECT_EQ(no_out.exit_code, 1);
  EXPECT_EQ(no_out.err, "gradaccum: error: --plots needs --output-dir (where the figures go)\n");
}

TEST(ReportErrors, ABrokenRecordNamesItsFileAndLine) {
  const auto dir = make_temp_dir("report-broken");
  {
    std::ofstream metrics(dir + "/metrics.jsonl");
    metrics << R"({"step": 1, "loss": 2.5, "lr": 0.1})"
            << "\n"
            << "{not json\n";
  }
  const auto r = run_cli("plot " + dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "gradaccum: error: " + dir +
                       "/metrics.jsonl:2: not a gradaccum record (a JSON object with an integer \"step\")\n");
  EXPECT_FALSE(fs::exists(dir + "/report.html"));
}

TEST(ReportErrors, AnUnwritableFigureDirectoryIsAOneLineError) {
  const auto& run = plotted_run();
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const auto blocker = make_temp_dir("report-blocked") + "/file";
  std::ofstream(blocker) << "a file, not a directory\n";
  const auto r = run_cli("plot " + run.dir + " --out " + blocker + "/figures");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "gradaccum: error: " + blocker + "/figures: cannot create the figures' directory\n");
}

// Headless Chromium (Debian's `chromium`, from scripts/setup.sh) loads report.html: the page's
// script counts the figures the browser decoded, and a screenshot of the whole page shows them.
std::string chromium() {
  for (const char* candidate : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"}) {
    if (fs::exists(candidate)) return candidate;
  }
  return "";
}

TEST(ReportInBrowser, ChromiumShowsEveryFigure) {
  const auto browser = chromium();
  if (browser.empty()) GTEST_SKIP() << "no chromium at /usr/bin (scripts/setup.sh installs Debian's chromium)";
  const auto& run = plotted_run();
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  const auto work = make_temp_dir("report-browser");
  const std::string flags =
      " --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir=" + work + "/profile ";
  const std::string url = "file://" + fs::absolute(run.dir + "/report.html").string();
  const std::string dom_command = "timeout 120 '" + browser + "'" + flags + "--dump-dom '" + url + "' > " + work +
                                  "/dom.html 2> " + work + "/dom.log";
  ASSERT_EQ(std::system(dom_command.c_str()), 0) << read_text(work + "/dom.log");
  const auto dom = read_text(work + "/dom.html");
  EXPECT_NE(dom.find("data-figures-shown=\"6/6\""), std::string::npos) << "the browser decoded every figure";

  // 1280 CSS pixels wide, tall enough for the whole page.
  const std::string shot = work + "/report.png";
  const std::string shot_command = "timeout 120 '" + browser + "'" + flags +
                                   "--window-size=1280,9000 --screenshot=" + shot + " '" + url + "' > " + work +
                                   "/shot.log 2>&1";
  ASSERT_EQ(std::system(shot_command.c_str()), 0) << read_text(work + "/shot.log");
  const auto png = read_png(shot);
  EXPECT_EQ(png.width, 1280);
  EXPECT_GE(png.distinct_colours(), 50u) << "not blank";
  EXPECT_GT(png.foreground_fraction(), 0.02) << "not blank";
  // Every panel of every figure is framed by a box: two horizontal dark lines, each longer than
  // 400 pixels, which nothing else on the page has (tables have light grey borders). The six
  // figures hold seven panels (window_items.png has two): fourteen such lines.
  int lines = 0;
  bool previous = false;
  for (int y = 0; y < png.height; ++y) {
    const bool frame = png.longest_dark_run(y) >= 400;
    lines += frame && !previous;
    previous = frame;
  }
  EXPECT_EQ(lines, 14) << "a figure is missing from the screenshot " << shot;
}

}  // namespace report_test
