// `gradaccum train [CONFIG] [--set key=value]... [--print-config]`
#pragma once

#include <string>
#include <vector>

namespace gradaccum::cli {

struct TrainArgs {
  std::string config_path;             // "" = built-in default
  std::vector<std::string> overrides;  // key=value
  bool print_config = false;
  int64_t nproc = 1;
};

// Returns the process exit code; throws gradaccum::Error on bad input.
int run_train(const TrainArgs& args);

}  // namespace gradaccum::cli
