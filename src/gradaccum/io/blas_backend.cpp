#include "gradaccum/io/blas_backend.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <utility>

namespace gradaccum::io {
namespace {

// OpenBLAS entry points looked up at run time: the program links libblas.so.3,
// which may be any BLAS, so none of them can be linked directly.
template <typename Fn>
Fn openblas_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

std::string openblas_kernels() {
  using GetCorename = char* (*)();
  auto get_corename = openblas_symbol<GetCorename>("openblas_get_corename");
  const char* name = get_corename != nullptr ? get_corename() : nullptr;
  return name != nullptr ? std::string(name) : std::string();
}

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

bool is_openblas(const BlasInfo& info) { return info.kind.rfind("openblas", 0) == 0; }

}  // namespace

BlasInfo probe_blas() {
  BlasInfo info{"", "other", ""};
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
  auto get_parallel = openblas_symbol<GetParallel>("openblas_get_parallel");
  if (get_parallel != nullptr && info.library.find("openblas") != std::string::npos) {
    const int parallel = get_parallel();
    info.kind = parallel == 2 ? "openblas-openmp" : parallel == 1 ? "openblas-pthread" : "openblas-serial";
    info.kernels = openblas_kernels();
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

IsaLevel cpu_isa_level() {
#if defined(__x86_64__) || defined(__i386__)
  // libgcc's checks include the OS's XSAVE state, so "supported" means usable.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd")) {
    return IsaLevel::avx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return IsaLevel::avx2;
  if (__builtin_cpu_supports("avx")) return IsaLevel::avx;
  return IsaLevel::sse;
#else
  return IsaLevel::unknown;  // only x86 OpenBLAS kernel sets are known below
#endif
}

IsaLevel openblas_kernels_isa(std::string_view kernels) {
  // OpenBLAS's x86-64 kernel sets (driver/others/dynamic.c) by the vector
  // instructions their GEMM kernels use.
  static const std::array<std::pair<std::string_view, IsaLevel>, 26> kTable{{
      {"SkylakeX", IsaLevel::avx512},     {"Cooperlake", IsaLevel::avx512},
      {"SapphireRapids", IsaLevel::avx512},
      {"Haswell", IsaLevel::avx2},        {"Zen", IsaLevel::avx2},
      {"Excavator", IsaLevel::avx2},
      {"Sandybridge", IsaLevel::avx},     {"Bulldozer", IsaLevel::avx},
      {"Piledriver", IsaLevel::avx},      {"Steamroller", IsaLevel::avx},
      {"Katmai", IsaLevel::sse},          {"Coppermine", IsaLevel::sse},
      {"Northwood", IsaLevel::sse},       {"Prescott", IsaLevel::sse},
      {"Banias", IsaLevel::sse},          {"Atom", IsaLevel::sse},
      {"Core2", IsaLevel::sse},           {"Penryn", IsaLevel::sse},
      {"Dunnington", IsaLevel::sse},      {"Nehalem", IsaLevel::sse},
      {"Athlon", IsaLevel::sse},          {"Opteron", IsaLevel::sse},
      {"Opteron_SSE3", IsaLevel::sse},    {"Barcelona", IsaLevel::sse},
      {"Nano", IsaLevel::sse},            {"Bobcat", IsaLevel::sse},
  }};
  for (const auto& [name, isa] : kTable) {
    if (same_name(name, kernels)) return isa;
  }
  return IsaLevel::unknown;
}

std::optional<std::string> better_openblas_kernels(std::string_view current, IsaLevel cpu) {
  const IsaLevel have = openblas_kernels_isa(current);
  if (have == IsaLevel::unknown || static_cast<int>(have) >= static_cast<int>(cpu)) {
    return std::nullopt;
  }
  switch (cpu) {
    case IsaLevel::avx512: return "SkylakeX";
    case IsaLevel::avx2: return "Haswell";
    case IsaLevel::avx: return "Sandybridge";
    default: return std::nullopt;
  }
}

const BlasKernelSelection& select_blas_kernels() {
  static const BlasKernelSelection selection = [] {
    const BlasInfo info = probe_blas();
    BlasKernelSelection s{info.kernels, info.kernels, ""};
    if (!is_openblas(info)) {
      s.reason = fmt::format("not OpenBLAS ({})", info.kind);
      return s;
    }
    if (const char* forced = std::getenv("OPENBLAS_CORETYPE"); forced != nullptr) {
      s.reason = fmt::format("OPENBLAS_CORETYPE={} (set by the user)", forced);
      return s;
    }
    const auto better = better_openblas_kernels(info.kernels, cpu_isa_level());
    if (!better) {
      s.reason = "as OpenBLAS detected them";
      return s;
    }
    using Hook = void (*)();
    auto quit = openblas_symbol<Hook>("gotoblas_dynamic_quit");
    auto init = openblas_symbol<Hook>("gotoblas_dynamic_init");
    if (quit == nullptr || init == nullptr) {  // not a DYNAMIC_ARCH build: nothing to choose
      s.reason = "OpenBLAS was built for one kernel set";
      return s;
    }
    // OpenBLAS reads OPENBLAS_CORETYPE only inside gotoblas_dynamic_init, and
    // quit only forgets the chosen set, so the pair re-selects in place.
    setenv("OPENBLAS_CORETYPE", better->c_str(), 1);
    quit();
    init();
    unsetenv("OPENBLAS_CORETYPE");
    s.active = openblas_kernels();
    s.reason = same_name(s.active, *better)
                   ? fmt::format("{} kernels do not use this CPU's vector units; forced {}",
                                 s.detected, *better)
                   : fmt::format("forcing {} left OpenBLAS on {}", *better, s.active);
    return s;
  }();
  return selection;
}

}  // namespace gradaccum::io
