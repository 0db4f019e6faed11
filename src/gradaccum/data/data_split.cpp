#include "gradaccum/data/data_split.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "gradaccum/base/check.h"

namespace gradaccum::data {

IndexSplit interleaved_split(int64_t n, double eval_fraction) {
  GA_CHECK(eval_fraction >= 0.0 && eval_fraction < 1.0, "eval_fraction must be in [0, 1), got {}", eval_fraction);
  GA_CHECK(n >= 0, "cannot split {} items", n);
  IndexSplit split;
  // floor(k·f) is computed the same way for every k, so the counts telescope
  // to exactly floor(n·f) whatever the rounding of k·f.
  auto below = [&](int64_t k) { return static_cast<int64_t>(std::floor(k * eval_fraction)); };
  for (int64_t i = 0; i < n; ++i) (below(i + 1) > below(i) ? split.eval : split.train).push_back(i);
  return split;
}

std::vector<int64_t> balance_classes(const std::vector<int64_t>& indices, const std::vector<int64_t>& labels,
                                     uint64_t seed) {
  std::map<int64_t, std::vector<int64_t>> by_class;  // positions in `indices`
  for (std::size_t p = 0; p < indices.size(); ++p) {
    const int64_t index = indices[p];
    GA_CHECK(index >= 0 && index < static_cast<int64_t>(labels.size()),
             "balance_classes: index {} out of range [0, {})", index, labels.size());
    by_class[labels[index]].push_back(static_cast<int64_t>(p));
  }
  if (by_class.empty()) return {};
  std::size_t smallest = indices.size();
  for (const auto& [label, positions] : by_class) smallest = std::min(smallest, positions.size());

  std::mt19937_64 rng(seed);
  std::vector<char> keep(indices.size(), 0);
  for (auto& [label, positions] : by_class) {
    // Partial Fisher–Yates: the first `smallest` positions become a uniform sample.
    for (std::size_t k = 0; k < smallest; ++k) {
      const std::size_t j = k + rng() % (positions.size() - k);
      std::swap(positions[k], positions[j]);
      keep[positions[k]] = 1;
    }
  }
  std::vector<int64_t> kept;
  kept.reserve(smallest * by_class.size());
  for (std::size_t p = 0; p < indices.size(); ++p)
    if (keep[p]) kept.push_back(indices[p]);
  return kept;
}

}  // namespace gradaccum::data
