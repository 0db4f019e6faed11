// The figures of a run directory (run_files.h), as PNG files (figure.h):
//   loss.png          1200×800  training loss per optimizer step, evaluation loss at its steps
//   lr.png            1200×800  learning rate per step
//   grad_norm.png     1200×800  gradient norm before and after clipping (log scale)
//   throughput.png    1200×800  tokens/s (language models) or samples/s per step
//   window_items.png  1200×800  per-window accounting: the window's normalizer (items) and the
//                               smallest, mean and largest micro-step of each window, each rank's
//                               share under data parallel
//   grad_flow.png     1600×1000 mean and max |grad| per parameter tensor (log scale), one line
//                               per logged step (at most six, first and last included); from
//                               grad_flow.jsonl
//   verify.png        1600×1000 `gradaccum verify`: each split's loss and gradient norm overlaid,
//                               and their relative difference from the reference per step
// A figure whose file has no data (no grad_flow.jsonl, no verify.json) is not written.
#pragma once

#include <string>
#include <vector>

#include "gradaccum/report/run_files.h"

namespace gradaccum::report {

struct FigureFile {
  std::string file;     // "loss.png"
  std::string caption;  // one sentence for the report
  int width = 0, height = 0;
};

// Writes the run's figures into `directory` (created if needed) and returns them in the order a
// report shows them. Throws gradaccum::Error naming a file that cannot be written.
std::vector<FigureFile> write_run_figures(const RunFiles& run, const std::string& directory);

}  // namespace gradaccum::report
