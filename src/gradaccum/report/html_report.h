// report.html: one self-contained page (the figures are embedded as data: URIs, so the file can
// be mailed or archived alone) that a person opens in a browser. It shows the decomposition
// (b × N × W, the global batch, the items per window), the summary, the per-window accounting
// (items of each micro-step and rank, the normalizer), every figure of run_figures.h and the
// resolved configuration. A script in the page counts the figures the browser decoded and writes
// the count into <body data-figures-shown="k/n">, which tests read from a headless browser.
#pragma once

#include <string>
#include <vector>

#include "gradaccum/report/run_figures.h"
#include "gradaccum/report/run_files.h"

namespace gradaccum::report {

// The page for `run`, with the figures in `figures` read from `figure_directory`.
std::string html_report(const RunFiles& run, const std::vector<FigureFile>& figures,
                        const std::string& figure_directory);

// Writes the figures into `figure_directory` and the page into `report_path` (atomically);
// returns the figures written. What `gradaccum plot` and `train --plots` do.
std::vector<FigureFile> write_report(const RunFiles& run, const std::string& figure_directory,
                                     const std::string& report_path);

}  // namespace gradaccum::report
