// Prints WindowPlan::permutation(epoch) for a dataset of n samples as one JSON
// line per epoch: {"epoch": e, "seed": s, "n": n, "head": [...], "checksum": Σ i·perm[i]}.
// The Python peer benchmark compares its own order against this one.
//   window_order [n=60000] [seed=42] [epochs=2] [head=16]
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

#include "gradaccum/core/window_plan.h"

int main(int argc, char** argv) {
  using gradaccum::core::BatchGeometry;
  using gradaccum::core::LastWindow;
  using gradaccum::core::WindowPlan;
  const int64_t n = argc > 1 ? std::stoll(argv[1]) : 60000;
  const uint64_t seed = argc > 2 ? std::stoull(argv[2]) : 42;
  const int64_t epochs = argc > 3 ? std::stoll(argv[3]) : 2;
  const int64_t head = argc > 4 ? std::stoll(argv[4]) : 16;
  // The permutation does not depend on the geometry; any b × N works.
  const WindowPlan plan(n, BatchGeometry::from_accumulation(1, 1), LastWindow::partial, seed);
  for (int64_t e = 0; e < epochs; ++e) {
    const auto perm = plan.permutation(e);
    const auto checksum = (perm * torch::arange(n, torch::kLong)).sum().item<int64_t>();  // order-sensitive
    const auto first = perm.slice(0, 0, std::min(head, n));
    std::vector<int64_t> values(first.data_ptr<int64_t>(), first.data_ptr<int64_t>() + first.numel());
    fmt::print("{{\"epoch\": {}, \"seed\": {}, \"n\": {}, \"head\": [{}], \"checksum\": {}}}\n", e, seed, n,
               fmt::join(values, ", "), checksum);
  }
  return 0;
}
