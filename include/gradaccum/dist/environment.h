// Who this process is in a data-parallel job, read from the variables the
// ecosystem's launchers set: torchrun (`torchrun --no-python`: RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI's mpirun
// (OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE, with MASTER_ADDR and
// MASTER_PORT given by the user), and `gradaccum train --nproc N`, which sets the
// torchrun variables for its children.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace gradaccum::dist {

struct DistEnvironment {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  int64_t local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // TORCHELASTIC_USE_AGENT_STORE: the launcher (torchrun) serves the store; no rank hosts it.
  bool agent_store = false;

  bool distributed() const { return world_size > 1; }
};

using EnvLookup = std::function<const char*(const char*)>;

// Reads the environment (std::getenv unless `lookup` is given). No variables:
// one process. Throws gradaccum::Error naming a malformed or inconsistent variable.
DistEnvironment read_environment(const EnvLookup& lookup = nullptr);

}  // namespace gradaccum::dist
