// `gradaccum config`: the configuration's keys, from their table (io/config_keys.h).
#pragma once

namespace gradaccum::cli {

struct ConfigArgs {
  bool reference = false;  // Markdown reference (docs/config.md) instead of the default YAML
};

// Prints the built-in default configuration (a file to start from), or the reference.
int run_config(const ConfigArgs& args);

}  // namespace gradaccum::cli
