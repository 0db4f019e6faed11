#include "gradaccum/cli/blas_probe.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <filesystem>

namespace gradaccum::cli {

BlasInfo probe_blas() {
  BlasInfo info{"", "other"};
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info where{};
  if (sgemm == nullptr || dladdr(sgemm, &where) == 0 || where.dli_fname == nullptr) {
    info.kind = "none";
    return info;
  }
  // Resolve the alternatives symlinks: /usr/lib/<arch>/libblas.so.3 names no provider.
  std::error_code error;
  const auto resolved = std::filesystem::canonical(where.dli_fname, error);
  info.library = error ? std::string(where.dli_fname) : resolved.string();
  // OpenBLAS reports how it was built: 0 serial, 1 pthreads, 2 OpenMP.
  using GetParallel = int (*)();
  auto get_parallel = reinterpret_cast<GetParallel>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  if (get_parallel != nullptr && info.library.find("openblas") != std::string::npos) {
    const int parallel = get_parallel();
    info.kind = parallel == 2 ? "openblas-openmp" : parallel == 1 ? "openblas-pthread" : "openblas-serial";
  } else if (info.library.find("/blas/") != std::string::npos) {
    info.kind = "reference";
  }
  return info;
}

std::string blas_warning(const BlasInfo& info) {
  if (info.kind == "openblas-openmp") return "";
  const char* why = info.kind == "reference"
                        ? "the reference BLAS is ~40x slower than OpenBLAS"
                    : info.kind == "openblas-pthread"
                        ? "its own thread pool fights libtorch's OpenMP threads (3-5x slower)"
                        : "it may be slower than the OpenMP OpenBLAS this program is tuned for";
  return fmt::format(
      "warning: BLAS is {} ({}): {}; run scripts/setup.sh or `apt-get install "
      "libopenblas0-openmp && update-alternatives --set libblas.so.3-x86_64-linux-gnu "
      "/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3`",
      info.kind, info.library.empty() ? "not found" : info.library, why);
}

}  // namespace gradaccum::cli
