#include "gradaccum/cli/config_command.h"

#include <fmt/format.h>

#include "gradaccum/io/config.h"
#include "gradaccum/io/config_keys.h"

namespace gradaccum::cli {

int run_config(const ConfigArgs& args) {
  fmt::print("{}", args.reference ? io::config_reference_markdown() : io::default_config_yaml());
  return 0;
}

}  // namespace gradaccum::cli
