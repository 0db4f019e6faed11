#include "gradaccum/dist/environment.h"

#include <cstdlib>
#include <string_view>

#include "gradaccum/base/check.h"

namespace gradaccum::dist {

namespace {
int64_t parse_int(const char* name, const char* text, int64_t min, int64_t max) {
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  GA_CHECK(end != text && *end == '\0' && value >= min && value <= max,
           "environment variable {}='{}': expected an integer in [{}, {}]", name, text, min, max);
  return value;
}
}  // namespace

DistEnvironment read_environment(const EnvLookup& lookup) {
  const EnvLookup get = lookup ? lookup : [](const char* name) -> const char* { return std::getenv(name); };
  DistEnvironment env;
  // torchrun's names first, then Open MPI's.
  const char* rank_name = get("RANK") ? "RANK" : get("OMPI_COMM_WORLD_RANK") ? "OMPI_COMM_WORLD_RANK" : nullptr;
  if (rank_name == nullptr) return env;
  const bool mpi = std::string(rank_name) == "OMPI_COMM_WORLD_RANK";
  const char* size_name = mpi ? "OMPI_COMM_WORLD_SIZE" : "WORLD_SIZE";
  const char* local_rank_name = mpi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "LOCAL_RANK";
  const char* local_size_name = mpi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "LOCAL_WORLD_SIZE";
  GA_CHECK(get(size_name) != nullptr, "environment variable {} is set but {} is not", rank_name, size_name);
  env.world_size = parse_int(size_name, get(size_name), 1, 1 << 20);
  env.rank = parse_int(rank_name, get(rank_name), 0, env.world_size - 1);
  env.local_rank = get(local_rank_name) ? parse_int(local_rank_name, get(local_rank_name), 0, env.world_size - 1) : 0;
  env.local_world_size = get(local_size_name) ? parse_int(local_size_name, get(local_size_name), 1, env.world_size) : 1;
  if (const char* addr = get("MASTER_ADDR")) env.master_addr = addr;
  if (const char* port = get("MASTER_PORT")) {
    env.master_port = static_cast<int>(parse_int("MASTER_PORT", port, 1, 65535));
  } else {
    GA_CHECK(!env.distributed(), "environment variable MASTER_PORT is not set ({} = {})", size_name, env.world_size);
  }
  // torchrun's agent already serves a TCPStore at MASTER_ADDR:MASTER_PORT and says so; every
  // rank then joins it as a client (rank 0 would otherwise fail to bind the port).
  if (const char* agent = get("TORCHELASTIC_USE_AGENT_STORE")) {
    env.agent_store = std::string_view(agent) == "True" || std::string_view(agent) == "1";
  }
  return env;
}

}  // namespace gradaccum::dist
