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

namespace {

// round(n·fraction) items shared among classes of `sizes` items each, none above its `capacity`:
// each class floor(size·fraction), then one more each, in order of the largest remainder (the
// smaller class index first on ties), until the total is reached.
std::vector<int64_t> class_quotas(const std::vector<int64_t>& sizes, const std::vector<int64_t>& capacity,
                                  double fraction) {
  int64_t n = 0, room = 0;
  for (std::size_t c = 0; c < sizes.size(); ++c) {
    n += sizes[c];
    room += capacity[c];
  }
  int64_t left = std::min<int64_t>(std::llround(static_cast<double>(n) * fraction), room);
  std::vector<int64_t> quota(sizes.size());
  std::vector<std::pair<double, std::size_t>> remainders;  // (-remainder, class): ascending is the order
  for (std::size_t c = 0; c < sizes.size(); ++c) {
    const double share = static_cast<double>(sizes[c]) * fraction;
    quota[c] = std::min(static_cast<int64_t>(std::floor(share)), capacity[c]);
    left -= quota[c];
    remainders.emplace_back(-(share - std::floor(share)), c);
  }
  std::sort(remainders.begin(), remainders.end());
  while (left > 0) {
    bool gave = false;
    for (const auto& [remainder, c] : remainders) {
      if (left == 0) break;
      if (quota[c] < capacity[c]) {
        ++quota[c];
        --left;
        gave = true;
      }
    }
    if (!gave) break;
  }
  return quota;
}

}  // namespace

StratifiedSplit stratified_split(const std::vector<int64_t>& labels, double eval_fraction, double test_fraction,
                                 uint64_t seed) {
  GA_CHECK(eval_fraction >= 0 && test_fraction >= 0 && eval_fraction + test_fraction < 1,
           "stratified split: eval_fraction {} and test_fraction {} must be >= 0 with a sum below 1", eval_fraction,
           test_fraction);
  std::map<int64_t, std::vector<int64_t>> by_class;  // items in order
  for (std::size_t i = 0; i < labels.size(); ++i) by_class[labels[i]].push_back(static_cast<int64_t>(i));
  std::vector<int64_t> sizes;
  for (const auto& [label, items] : by_class) sizes.push_back(static_cast<int64_t>(items.size()));
  const auto test = class_quotas(sizes, sizes, test_fraction);
  std::vector<int64_t> room(sizes.size());
  for (std::size_t c = 0; c < sizes.size(); ++c) room[c] = sizes[c] - test[c];
  const auto eval = class_quotas(sizes, room, eval_fraction);

  std::mt19937_64 rng(seed);
  StratifiedSplit split;
  std::size_t c = 0;
  for (auto& [label, items] : by_class) {
    for (std::size_t k = 0; k + 1 < items.size(); ++k) {  // Fisher–Yates
      const std::size_t j = k + rng() % (items.size() - k);
      std::swap(items[k], items[j]);
    }
    const auto t = static_cast<std::size_t>(test[c]), e = static_cast<std::size_t>(eval[c]);
    split.test.insert(split.test.end(), items.begin(), items.begin() + t);
    split.eval.insert(split.eval.end(), items.begin() + t, items.begin() + t + e);
    split.train.insert(split.train.end(), items.begin() + t + e, items.end());
    ++c;
  }
  for (auto* part : {&split.train, &split.eval, &split.test}) std::sort(part->begin(), part->end());
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
