#include "gradaccum/kernels/mkl_intel_path.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <atomic>

#include "gradaccum/kernels/cpu_and_blas.h"
#include "gradaccum/kernels/custom_kernels.h"

namespace gradaccum::kernels {
namespace {

using VendorCheck = int (*)();

std::atomic<bool> decided{false};

// The setting in force at MKL's first question, kept for the process: MKL
// keeps its first answer, so ours must not change after it.
bool intel_path_chosen() {
  static const bool chosen = [] {
    decided.store(true);
    return custom_kernel_enabled(CustomKernel::mkl_intel_path);
  }();
  return chosen;
}

// MKL's own answer: the next definition of the check after libgradaccum's in the
// process's lookup order (libtorch_cpu.so's), or "not Intel" where none is. Looked
// up once: with the path off, MKL asks mkl_serv_intel_cpu on every GEMM.
VendorCheck next_definition(const char* name) { return reinterpret_cast<VendorCheck>(dlsym(RTLD_NEXT, name)); }

int mkl_own_answer(VendorCheck own) { return own != nullptr ? own() : 0; }

}  // namespace

bool mkl_intel_path_decided() { return decided.load(); }

bool mkl_intel_path_active() {
  // Only where MKL's calls reach the definitions below (libgradaccum linked before libtorch);
  // the link order is fixed for the process, so this is looked up once.
  static const bool applies = [] {
    if (!libtorch_blas_is_mkl() || cpu_is_intel()) return false;
    const auto reached = dlsym(RTLD_DEFAULT, "mkl_serv_intel_cpu_true");
    Dl_info ours{}, found{};
    return reached != nullptr && dladdr(reinterpret_cast<void*>(&mkl_intel_path_active), &ours) != 0 &&
           dladdr(reached, &found) != 0 && ours.dli_fbase == found.dli_fbase;
  }();
  if (!applies) return false;
  return decided.load() ? intel_path_chosen() : custom_kernel_enabled(CustomKernel::mkl_intel_path);
}

std::string mkl_intel_path_description() {
  return mkl_intel_path_active() ? fmt::format("MKL's Intel code path on this {} CPU", cpu_vendor()) : std::string();
}

}  // namespace gradaccum::kernels

// MKL's vendor checks (see the header). Exported with C linkage and default
// visibility so that they precede libtorch_cpu.so's in symbol lookup.
extern "C" __attribute__((visibility("default"))) int mkl_serv_intel_cpu_true() {
  using namespace gradaccum::kernels;
  static const VendorCheck own = next_definition("mkl_serv_intel_cpu_true");
  return intel_path_chosen() ? 1 : mkl_own_answer(own);
}

extern "C" __attribute__((visibility("default"))) int mkl_serv_intel_cpu() {
  using namespace gradaccum::kernels;
  static const VendorCheck own = next_definition("mkl_serv_intel_cpu");
  return intel_path_chosen() ? 1 : mkl_own_answer(own);
}
