// `gradaccum verify [CONFIG] --splits 64x1,16x4,4x16 [--steps K] [--set key=value]...`
//
// Trains the configuration once per split of the same global batch, in
// float64, and reports how far each trajectory (per-step loss and gradient
// norm, final weights) is from the first split's. Exact accumulation keeps them
// within `--tolerance` (default 1e-10 relative, DESIGN.md §1); a normalization
// bug shows up at 1e-3 to 1e-1. With `--output-dir DIR` the trajectories go to DIR/verify.json
// (report/run_files.h), which `gradaccum plot DIR` draws; `--plots` draws them at once.
#pragma once

#include <string>
#include <vector>

namespace gradaccum::cli {

struct VerifyArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string splits = "64x1,16x4,4x16";  // b x N, one world
  int64_t steps = 10;
  double tolerance = 1e-10;
  std::string output_dir;  // "" = print only
  bool plots = false;      // needs output_dir
};

// Returns 0 when every split agrees within the tolerance, 1 otherwise.
int run_verify(const VerifyArgs& args);

}  // namespace gradaccum::cli
