// Deterministic train/eval splits that need no download and no shuffling: the
// assignment of an item depends only on its index and the fraction, never on
// batch settings, so every decomposition of a run sees the same two sets.
#pragma once

#include <cstdint>
#include <vector>

namespace gradaccum::data {

struct IndexSplit {
  std::vector<int64_t> train;  // ascending
  std::vector<int64_t> eval;   // ascending
};

// Item i of n goes to eval when ⌊(i+1)·f⌋ > ⌊i·f⌋: the eval items are spread
// evenly through the sequence (f = 0.1: items 9, 19, 29, ...), so every region
// of an ordered corpus (every book of the Bible) is represented. The sum
// telescopes: exactly ⌊n·f⌋ eval items. eval_fraction must be in [0, 1).
IndexSplit interleaved_split(int64_t n, double eval_fraction);

struct StratifiedSplit {
  std::vector<int64_t> train;  // ascending
  std::vector<int64_t> eval;   // ascending
  std::vector<int64_t> test;   // ascending
};

// Splits items 0..n-1 (labels[i] is item i's class) into train, eval and test with each class in
// the proportions of the whole: test takes round(n·test_fraction) items and eval round(n·
// eval_fraction), shared among the classes in proportion to their sizes (each class its floor,
// the rest one each to the largest remainders, the smaller label first on ties). Which items of
// a class go where is a seeded shuffle of the class (std::mt19937_64 with its own Fisher–Yates
// loop, as balance_classes), so the split is a function of the labels, the fractions and the seed
// alone. The fractions must be >= 0 with a sum below 1.
StratifiedSplit stratified_split(const std::vector<int64_t>& labels, double eval_fraction, double test_fraction,
                                 uint64_t seed);

// The items of `indices` whose class (labels[index]) keeps a seeded random
// subset as large as the rarest class present among them; order is kept. The
// draw uses std::mt19937_64 with its own Fisher–Yates loop, so it is the same
// on every platform and standard library.
std::vector<int64_t> balance_classes(const std::vector<int64_t>& indices, const std::vector<int64_t>& labels,
                                     uint64_t seed);

}  // namespace gradaccum::data
