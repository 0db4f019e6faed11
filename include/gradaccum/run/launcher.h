// `gradaccum train --nproc N`: starts N ranks of one job on this host, the way
// torchrun would (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), and watches them: when one fails, the others are stopped and
// the failing rank is named.
#pragma once

#include <string>
#include <vector>

namespace gradaccum::run {

// `child_args` are the arguments after the program name, without --nproc.
// Returns the exit code for the launcher process.
int launch_local(int64_t nproc, const std::vector<std::string>& child_args);

}  // namespace gradaccum::run
