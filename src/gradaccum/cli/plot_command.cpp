#include "gradaccum/cli/plot_command.h"

#include <fmt/format.h>

#include <filesystem>

#include "gradaccum/report/html_report.h"
#include "gradaccum/report/run_files.h"

namespace gradaccum::cli {

void write_plots_and_report(const std::string& run_dir, const std::string& out_dir) {
  const auto run = report::read_run_files(run_dir);
  const std::filesystem::path figures =
      out_dir.empty() ? std::filesystem::path(run_dir) / "plots" : std::filesystem::path(out_dir);
  const std::filesystem::path page = (out_dir.empty() ? std::filesystem::path(run_dir) : figures) / "report.html";
  const auto written = report::write_report(run, figures.string(), page.string());
  fmt::print("plots: {} figures in {}; report: {}\n", written.size(), figures.string(), page.string());
}

int run_plot(const PlotArgs& args) {
  write_plots_and_report(args.run_dir, args.out_dir);
  return 0;
}

}  // namespace gradaccum::cli
