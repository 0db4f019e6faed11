// The King James Bible from Debian's bible-kjv-text package, and the two tasks
// built on its 31102 verses: causal language modelling and Old vs New
// Testament classification.
//
// The package stores the text in a private compressed format; the `bible`
// program of the bible-kjv package (which bible-kjv-text only recommends)
// prints it: `bible -f Gen1:1-Rev22:21` writes one verse per line as
// `Ge1:1 In the beginning God created the heaven and the earth.` (0.2 s).
// The verse counts are checked so that a broken install fails loudly.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gradaccum/data/classification_dataset.h"
#include "gradaccum/data/lm_dataset.h"
#include "gradaccum/data/tokenizer.h"

namespace gradaccum::data {

inline constexpr int64_t kKjvVerses = 31102;
inline constexpr int64_t kKjvOldTestamentVerses = 23145;  // Genesis .. Malachi, 39 books
inline constexpr int64_t kKjvNewTestamentVerses = 7957;   // Matthew .. Revelation, 27 books

struct Verse {
  std::string book;  // the program's abbreviation: "Ge", "Exo", ..., "Mat", ..., "Rev"
  int chapter = 0;
  int verse = 0;
  std::string text;   // as printed, without the reference
  int testament = 0;  // 0 = Old (the first 39 books), 1 = New (from Matthew)
};

// "Ge1:1"
std::string verse_reference(const Verse& v);

// Verses of a `bible -f` listing, in order. Every line must be `<book><chapter>:<verse>
// <text>` with one of the 66 books in canonical order; anything else throws
// gradaccum::Error naming `source`, the line and the install hint. No count check.
std::vector<Verse> parse_kjv_listing(std::string_view listing, const std::string& source);

// All 31102 verses from `program -f Gen1:1-Rev22:21`. Throws gradaccum::Error
// with the hint `apt install bible-kjv bible-kjv-text` when the program is missing,
// fails, prints nothing or garbage, or the verse counts (31102 = 23145 Old +
// 7957 New) do not match.
std::vector<Verse> load_kjv(const std::string& program = "bible");

// The train/eval split of both tasks: verse i (in canonical order) is an eval
// verse when interleaved_split (data_split.h) says so, i.e. evenly spread
// through every book, ⌊31102·eval_fraction⌋ of them (3110 for 0.1: every 10th
// verse). It depends on nothing but eval_fraction — not on batch sizes, seeds
// or tokenizers. Neighbouring verses are often near-duplicates, so eval loss
// measures fitting the book's style more than generalization.

struct KjvLmOptions {
  // pad_token_id / eos_token_id < 0 take the tokenizer's "<|endoftext|>" id.
  LmDatasetOptions dataset;
  double eval_fraction = 0.1;
  std::string program = "bible";
};

// One document per verse (its text, without the reference).
CausalLmData make_kjv_lm_data(const Tokenizer& tokenizer, const KjvLmOptions& options);
CausalLmData make_kjv_lm_data(const std::vector<Verse>& verses, const Tokenizer& tokenizer,
                              const KjvLmOptions& options);

// Old (label 0) vs New (label 1) Testament from a verse's text.
//
// 74.4% of the verses are Old Testament, so a model that always answers "Old"
// is right that often: on the default eval split (eval_fraction 0.1) the
// majority-class baseline is 2314 / 3110 = 74.41% (tests/fixtures/text_data_test.cpp
// checks these numbers). `balanced` keeps, in each of train and eval
// separately, a seeded random subset of the Old Testament verses as large as
// that part's New Testament (the split itself is unchanged), so the baseline is
// 50%: 796 + 796 eval verses, 7161 + 7161 training verses.
struct KjvTestamentOptions {
  int64_t max_length = 128;   // tokens kept from the start of each verse
  TokenId pad_token_id = -1;  // < 0: the tokenizer's "<|endoftext|>" id
  double eval_fraction = 0.1;
  bool balanced = false;
  uint64_t seed = 42;  // used only when balanced
  std::string program = "bible";
};

ClassificationData make_kjv_testament_data(const Tokenizer& tokenizer, const KjvTestamentOptions& options);
ClassificationData make_kjv_testament_data(const std::vector<Verse>& verses, const Tokenizer& tokenizer,
                                           const KjvTestamentOptions& options);

}  // namespace gradaccum::data
