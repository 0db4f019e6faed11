// `gradaccum train [CONFIG] [--set key=value]... [--print-config] [--nproc N]`
#pragma once

#include <string>
#include <vector>

namespace gradaccum::cli {

struct TrainArgs {
  std::string config_path;             // "" = built-in default
  std::vector<std::string> overrides;  // key=value
  bool print_config = false;
  bool plots = false;                   // figures and report.html at the end (cli/plot_command.h)
  int64_t nproc = 1;                    // > 1: start that many local ranks
  std::vector<std::string> child_args;  // the command line without --nproc, for the ranks
};

// Returns the process exit code; throws gradaccum::Error on bad input.
int run_train(const TrainArgs& args);

}  // namespace gradaccum::cli
