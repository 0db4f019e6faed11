// `gradaccum plot RUN_DIR [--out DIR]`: the figures of a run directory as PNG files and the run
// report (report/html_report.h) that shows them. Without --out the figures go to RUN_DIR/plots
// and the report to RUN_DIR/report.html; with it, both go to DIR. RUN_DIR is the output_dir of
// `gradaccum train` (any time: a run still going reads too) or of `gradaccum verify
// --output-dir`.
#pragma once

#include <string>

namespace gradaccum::cli {

struct PlotArgs {
  std::string run_dir;
  std::string out_dir;  // empty: RUN_DIR/plots and RUN_DIR/report.html
};

// Writes the figures and the report; returns 0. Throws gradaccum::Error (one line) when RUN_DIR
// is not a run directory or a file cannot be written.
int run_plot(const PlotArgs& args);

// What `train --plots` and `verify --plots` call at the end: the figures into
// `run_dir`/plots, the report into `run_dir`/report.html; prints where they are.
void write_plots_and_report(const std::string& run_dir, const std::string& out_dir = "");

}  // namespace gradaccum::cli
