// Text data: padding, labels and masks of causal-LM and classification batches
// on hand-made corpora (exact tensors), truncation, packing, text/JSONL reading
// and its errors, the KJV corpus (counts, first and last verses), its
// deterministic split and the majority-class baseline of the testament task.
//
// The KJV tests need Debian's bible-kjv-text and the GPT-2 vocabulary (both
// installed by scripts/setup.sh); without them they FAIL with the install hint.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gradaccum/base/check.h"
#include "gradaccum/data/classification_dataset.h"
#include "gradaccum/data/data_split.h"
#include "gradaccum/data/kjv.h"
#include "gradaccum/data/lm_dataset.h"
#include "gradaccum/data/text_source.h"
#include "gradaccum/data/tokenizer.h"
#include "gradaccum/models/causal_lm.h"
#include "test_support.h"

namespace gradaccum::data {
namespace text_data_test {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

const std::string kTextDir = std::string(GRADACCUM_TEST_DATA) + "/text";

torch::Tensor ids(std::initializer_list<int64_t> v) { return torch::tensor(std::vector<int64_t>(v)); }
torch::Tensor rows(std::vector<std::vector<int64_t>> v) {
  std::vector<torch::Tensor> r;
  for (auto& row : v) r.push_back(torch::tensor(row));
  return torch::stack(r);
}

// The message of the gradaccum::Error `f` throws ("" if it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------- causal LM

// Four documents: one of a single token (dropped), one longer than max_length.
const std::vector<std::vector<TokenId>> kDocs = {{5, 6, 7}, {8, 9}, {1}, {10, 11, 12, 13, 14}};

LmDatasetOptions padded(int64_t max_length) {
  LmDatasetOptions o;
  o.max_length = max_length;
  o.pad_token_id = 0;
  return o;
}

TEST(TextDataLm, PadsEachMicroBatchToItsLongestRow) {
  CausalLmDataset d(kDocs, padded(4));
  ASSERT_EQ(d.size(), 3);
  EXPECT_EQ(d.dropped_documents(), 1);
  EXPECT_EQ(d.truncated_documents(), 1);
  EXPECT_EQ(d.lengths(), (std::vector<int64_t>{3, 2, 4}));
  EXPECT_EQ(d.tokens(), 9);
  EXPECT_TRUE(d.sample_lengths().equal(ids({3, 2, 4})));
  EXPECT_EQ(d.summary(), "4 documents, 1 dropped (< 2 tokens), 1 truncated to 4 tokens: 3 samples, 9 tokens");

  auto b = d.get(ids({1, 0}), torch::kFloat);
  EXPECT_EQ(b.samples, 2);
  EXPECT_TRUE(b.input.equal(rows({{8, 9, 0}, {5, 6, 7}})));
  EXPECT_TRUE(b.target.equal(rows({{8, 9, -100}, {5, 6, 7}})));
  EXPECT_TRUE(b.attention_mask.equal(rows({{1, 1, 0}, {1, 1, 1}})));
  EXPECT_EQ(b.input.scalar_type(), torch::kLong);
  EXPECT_EQ(b.target.scalar_type(), torch::kLong);
  EXPECT_EQ(b.attention_mask.scalar_type(), torch::kLong);

  // A micro-batch with the long document is as wide as it (after truncation).
  b = d.get(ids({2, 1, 2}), torch::kDouble);
  EXPECT_TRUE(b.input.equal(rows({{10, 11, 12, 13}, {8, 9, 0, 0}, {10, 11, 12, 13}})));
  EXPECT_TRUE(b.target.equal(rows({{10, 11, 12, 13}, {8, 9, -100, -100}, {10, 11, 12, 13}})));
  EXPECT_TRUE(b.attention_mask.equal(rows({{1, 1, 1, 1}, {1, 1, 0, 0}, {1, 1, 1, 1}})));

  // One row: no padding at all.
  b = d.get(ids({0}), torch::kFloat);
  EXPECT_TRUE(b.input.equal(rows({{5, 6, 7}})));
  EXPECT_TRUE(b.attention_mask.equal(rows({{1, 1, 1}})));
}

TEST(TextDataLm, TruncationKeepsTheFirstTokens) {
  CausalLmDataset d(kDocs, padded(2));
  EXPECT_EQ(d.truncated_documents(), 2);
  EXPECT_EQ(d.lengths(), (std::vector<int64_t>{2, 2, 2}));
  auto b = d.get(ids({0, 1, 2}), torch::kFloat);
  EXPECT_TRUE(b.input.equal(rows({{5, 6}, {8, 9}, {10, 11}})));
  EXPECT_TRUE(b.target.equal(b.input));
  EXPECT_EQ(b.attention_mask.sum().item<int64_t>(), 6);
}

TEST(TextDataLm, PackingJoinsDocumentsWithEosIntoFullBlocks) {
  LmDatasetOptions o;
  o.packing = true;
  o.eos_token_id = 99;
  o.max_length = 3;
  // Stream: 5 6 7 99 8 9 99 10 11 12 13 14 99 (13 tokens; {1} dropped) → 4 blocks, 1 left over.
  CausalLmDataset d(kDocs, o);
  ASSERT_EQ(d.size(), 4);
  EXPECT_EQ(d.dropped_documents(), 1);
  EXPECT_EQ(d.dropped_tail_tokens(), 1);
  EXPECT_EQ(d.tokens(), 12);
  EXPECT_EQ(d.lengths(), (std::vector<int64_t>{3, 3, 3, 3}));
  auto b = d.get(ids({0, 1, 2, 3}), torch::kFloat);
  EXPECT_TRUE(b.input.equal(rows({{5, 6, 7}, {99, 8, 9}, {99, 10, 11}, {12, 13, 14}})));
  EXPECT_TRUE(b.target.equal(b.input));
  EXPECT_TRUE(b.attention_mask.equal(torch::ones({4, 3}, torch::kLong)));
  EXPECT_EQ(d.summary(),
            "4 documents, 1 dropped (< 2 tokens), packed into blocks of 3 (1 tail tokens "
            "dropped): 4 samples, 12 tokens");

  o.max_length = 5;  // 13 tokens → 2 blocks of 5, 3 left over
  CausalLmDataset d5(kDocs, o);
  ASSERT_EQ(d5.size(), 2);
  EXPECT_EQ(d5.dropped_tail_tokens(), 3);
  EXPECT_TRUE(d5.get(ids({1, 0}), torch::kFloat).input.equal(rows({{9, 99, 10, 11, 12}, {5, 6, 7, 99, 8}})));
}

TEST(TextDataLm, LabelCountEqualsSumOfLengthsMinusOne) {
  // Rows of 2..9 tokens: after the loss's shift each row of n real tokens has
  // n - 1 targets, and the padding none.
  std::vector<std::vector<TokenId>> docs;
  for (int n = 2; n < 10; ++n) {
    docs.emplace_back();
    for (int k = 0; k < n; ++k) docs.back().push_back(100 + 10 * n + k);
  }
  CausalLmDataset d(docs, padded(16));
  auto b = d.get(ids({7, 0, 3, 5, 1}), torch::kFloat);
  const int64_t expected = (9 - 1) + (2 - 1) + (5 - 1) + (7 - 1) + (3 - 1);
  EXPECT_EQ(b.target.slice(1, 1).ne(core::kIgnoreIndex).sum().item<int64_t>(), expected);
  // The same count the causal-LM loss reports.
  auto logits = torch::randn({b.samples, b.input.size(1), 200});
  EXPECT_EQ(models::causal_lm_loss(logits, b.target).count.item<int64_t>(), expected);
}

TEST(TextDataLm, Errors) {
  EXPECT_EQ(error_of([] { CausalLmDataset(kDocs, padded(1)); }),
            "lm dataset: max_length must be at least 2 (one input and one target token), got 1");
  EXPECT_EQ(error_of([] { CausalLmDataset(kDocs, LmDatasetOptions{}); }),
            "lm dataset: padding needs pad_token_id (>= 0)");
  LmDatasetOptions packing;
  packing.packing = true;
  EXPECT_EQ(error_of([&] { CausalLmDataset(kDocs, packing); }),
            "lm dataset: packing needs eos_token_id (the separator between documents)");
  EXPECT_EQ(error_of([] {
              CausalLmDataset({{1, 2}, {3, -4}}, padded(4));
            }),
            "lm dataset: document 1 has a negative token id -4");
  EXPECT_EQ(error_of([] {
              CausalLmDataset({{1}, {}}, padded(4));
            }),
            "lm dataset: no samples from 2 documents (2 with fewer than 2 tokens)");
  packing.eos_token_id = 0;
  packing.max_length = 8;
  EXPECT_EQ(error_of([&] {
              CausalLmDataset({{1, 2}, {3, 4}}, packing);
            }),
            "lm dataset: no samples from 2 documents (0 with fewer than 2 tokens, 6 tokens in "
            "all, less than one block of 8)");

  CausalLmDataset d(kDocs, padded(4));
  EXPECT_EQ(error_of([&] { d.get(ids({0, 3}), torch::kFloat); }), "lm dataset: sample index 3 out of range [0, 3)");
  EXPECT_EQ(error_of([&] { d.get(ids({-1}), torch::kFloat); }), "lm dataset: sample index -1 out of range [0, 3)");
  EXPECT_EQ(error_of([&] { d.get(torch::zeros({1}), torch::kFloat); }),
            "lm dataset: sample indices must be a 1-D integer tensor, got 1-D Float");
}

// ------------------------------------------------------------ classification

TEST(TextDataClassification, PadsRightKeepsTheStartAndStacksLabels) {
  ClassificationDatasetOptions o;
  o.max_length = 3;
  o.pad_token_id = 7;
  o.num_labels = 3;
  SequenceClassificationDataset d({{{1, 2, 3, 4, 5}, 2}, {{6}, 0}, {{8, 9}, 1}}, o);
  ASSERT_EQ(d.size(), 3);
  EXPECT_EQ(d.truncated_examples(), 1);
  EXPECT_EQ(d.lengths(), (std::vector<int64_t>{3, 1, 2}));
  EXPECT_TRUE(d.sample_lengths().equal(ids({3, 1, 2})));
  EXPECT_EQ(d.label_counts(), (std::vector<int64_t>{1, 1, 1}));
  auto b = d.get(ids({1, 2}), torch::kFloat);
  EXPECT_EQ(b.samples, 2);
  EXPECT_TRUE(b.input.equal(rows({{6, 7}, {8, 9}})));
  EXPECT_TRUE(b.attention_mask.equal(rows({{1, 0}, {1, 1}})));
  EXPECT_TRUE(b.target.equal(ids({0, 1})));
  b = d.get(ids({2, 0, 1}), torch::kFloat);
  EXPECT_TRUE(b.input.equal(rows({{8, 9, 7}, {1, 2, 3}, {6, 7, 7}})));
  EXPECT_TRUE(b.attention_mask.equal(rows({{1, 1, 0}, {1, 1, 1}, {1, 0, 0}})));
  EXPECT_TRUE(b.target.equal(ids({1, 2, 0})));
}

TEST(TextDataClassification, Errors) {
  ClassificationDatasetOptions o;
  o.pad_token_id = 0;
  EXPECT_EQ(error_of([&] {
              SequenceClassificationDataset({{{1}, 0}, {{2}, 2}}, o);
            }),
            "classification dataset: example 1 has label 2, outside [0, 2)");
  EXPECT_EQ(error_of([&] {
              SequenceClassificationDataset({{{1}, -1}}, o);
            }),
            "classification dataset: example 0 has label -1, outside [0, 2)");
  EXPECT_EQ(error_of([&] {
              SequenceClassificationDataset({{{1}, 0}, {{}, 1}}, o);
            }),
            "classification dataset: example 1 has no tokens");
  SequenceClassificationDataset d({{{1}, 0}}, o);
  EXPECT_EQ(error_of([&] { d.get(ids({1}), torch::kFloat); }),
            "classification dataset: sample index 1 out of range [0, 1)");
  o.pad_token_id = -1;
  EXPECT_EQ(error_of([&] {
              SequenceClassificationDataset({{{1}, 0}}, o);
            }),
            "classification dataset: pad_token_id must be >= 0, got -1");
}

// ---------------------------------------------------------------- text files

TEST(TextDataSource, PlainTextIsOneDocumentPerNonEmptyLine) {
  const auto r = read_text_records(kTextDir + "/documents.txt");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].text, "In the beginning.");
  EXPECT_EQ(r[1].text, "And the earth was without form.");  // "\r\n" removed
  EXPECT_EQ(r[2].text, "Jesus wept.");                      // no final newline
  for (const auto& x : r) EXPECT_EQ(x.label, -1);
}

TEST(TextDataSource, JsonLinesWithAndWithoutLabels) {
  auto r = read_text_records(kTextDir + "/labelled.jsonl");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].text, "In the beginning God created the heaven and the earth.");
  EXPECT_EQ(r[1].text, "Jesus wept.");
  EXPECT_EQ(r[2].text, "Amen.");
  EXPECT_EQ(r[0].label, 0);
  EXPECT_EQ(r[1].label, 1);
  EXPECT_EQ(r[2].label, 1);
  r = read_jsonl_records(kTextDir + "/unlabelled.jsonl");
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].text, "first \"quoted\" line\nwith a newline");
  EXPECT_EQ(r[1].text, "caf\xc3\xa9");
  EXPECT_EQ(r[1].label, -1);
}

class TextDataSourceErrors : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& content) {
    const auto path = (fs::path(dir_) / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  std::string dir_ = testing::make_temp_dir("text-data");
};

TEST_F(TextDataSourceErrors, EachNamesTheFileAndLine) {
  const auto bad = write("bad.jsonl", "{\"text\": \"a\"}\n\n{\"text\": \"b\"\n");
  EXPECT_THAT(error_of([&] { read_jsonl_records(bad); }),
              HasSubstr(bad + ":3: invalid JSON: [json.exception.parse_error.101]"));
  const auto missing = write("missing.jsonl", "{\"text\": \"a\"}\n{\"txt\": \"b\"}\n");
  EXPECT_EQ(error_of([&] { read_jsonl_records(missing); }), missing + ":2: missing key \"text\"");
  const auto number = write("number.jsonl", "{\"text\": 12}\n");
  EXPECT_EQ(error_of([&] { read_jsonl_records(number); }), number + ":1: \"text\" is number, not a string");
  const auto array = write("array.jsonl", "[\"text\"]\n");
  EXPECT_EQ(error_of([&] { read_jsonl_records(array); }),
            array + ":1: expected a JSON object like {\"text\": ...}, got array");
  const auto fractional = write("fractional.jsonl", "{\"text\": \"a\", \"label\": 1.5}\n");
  EXPECT_EQ(error_of([&] { read_jsonl_records(fractional); }), fractional + ":1: \"label\" is 1.5, not an integer");
  const auto quoted = write("quoted.jsonl", "{\"text\": \"a\", \"label\": \"1\"}\n");
  EXPECT_EQ(error_of([&] { read_jsonl_records(quoted); }), quoted + ":1: \"label\" is \"1\", not an integer");
  const auto negative = write("negative.jsonl", "{\"text\": \"a\", \"label\": -1}\n");
  EXPECT_EQ(error_of([&] { read_jsonl_records(negative); }),
            negative + ":1: \"label\" is -1; labels are integers >= 0");
  const auto mixed = write("mixed.jsonl",
                           "{\"text\": \"a\", \"label\": 0}\n{\"text\": \"b\", \"label\": 1}\n"
                           "{\"text\": \"c\"}\n");
  EXPECT_EQ(error_of([&] { read_jsonl_records(mixed); }),
            mixed + ":3: has no \"label\" but line 1 has one; label every line or none");
  const auto mixed2 = write("mixed2.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\", \"label\": 1}\n");
  EXPECT_EQ(error_of([&] { read_jsonl_records(mixed2); }),
            mixed2 + ":2: has a \"label\" but line 1 has none; label every line or none");
}

TEST_F(TextDataSourceErrors, ByteOrderMarkIsSkipped) {
  const auto jsonl = write("bom.jsonl", "\xEF\xBB\xBF{\"text\": \"a\"}\r\n{\"text\": \"b\"}\r\n");
  const auto r = read_jsonl_records(jsonl);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].text, "a");
  const auto txt = write("bom.txt",
                         "\xEF\xBB\xBF"
                         "first\nsecond\n");
  EXPECT_EQ(read_text_lines(txt)[0].text, "first");
}

TEST_F(TextDataSourceErrors, EmptyAndMissingFiles) {
  const auto empty = write("empty.jsonl", "");
  EXPECT_EQ(error_of([&] { read_text_records(empty); }),
            empty + ": no documents (the file is empty or has only blank lines)");
  const auto blank = write("blank.txt", "\n  \n\r\n");
  EXPECT_EQ(error_of([&] { read_text_records(blank); }),
            blank + ": no documents (the file is empty or has only blank lines)");
  const auto absent = dir_ + "/absent.txt";
  EXPECT_EQ(error_of([&] { read_text_lines(absent); }), absent + ": cannot open: No such file or directory");
  EXPECT_EQ(error_of([&] { read_jsonl_records(dir_); }), dir_ + ": is a directory, not a text file");
}

// ---------------------------------------------------------------- splits

TEST(TextDataSplit, InterleavedSplitIsEvenAndExact) {
  const auto s = interleaved_split(31102, 0.1);
  EXPECT_EQ(s.train.size(), 27992u);
  ASSERT_EQ(s.eval.size(), 3110u);
  EXPECT_EQ(s.eval[0], 9);
  EXPECT_EQ(s.eval[1], 19);
  EXPECT_EQ(s.eval.back(), 31099);
  const auto again = interleaved_split(31102, 0.1);
  EXPECT_EQ(again.train, s.train);
  EXPECT_EQ(again.eval, s.eval);
  // ⌊n·f⌋ eval items for fractions whose products round awkwardly, too.
  for (double f : {0.0, 0.05, 0.3, 1.0 / 3.0, 0.7, 0.99}) {
    const auto t = interleaved_split(1000, f);
    EXPECT_EQ(static_cast<int64_t>(t.eval.size()), static_cast<int64_t>(std::floor(1000 * f))) << f;
    EXPECT_EQ(t.train.size() + t.eval.size(), 1000u);
  }
  EXPECT_EQ(error_of([] { interleaved_split(10, 1.0); }), "eval_fraction must be in [0, 1), got 1");
  EXPECT_EQ(error_of([] { interleaved_split(10, -0.5); }), "eval_fraction must be in [0, 1), got -0.5");
}

TEST(TextDataSplit, BalanceClassesIsSeededAndKeepsOrder) {
  const std::vector<int64_t> labels = {0, 0, 1, 0, 0, 1, 0, 0, 0, 1};
  std::vector<int64_t> all(10);
  std::iota(all.begin(), all.end(), 0);
  const auto a = balance_classes(all, labels, 7);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  int64_t ones = 0;
  for (auto i : a) ones += labels[i];
  EXPECT_EQ(ones, 3);
  EXPECT_EQ(balance_classes(all, labels, 7), a);
  // Another seed draws another subset of the 7 zeros (35 subsets of 3; these two differ).
  EXPECT_NE(balance_classes(all, labels, 8), a);
}

// ---------------------------------------------------------------- KJV

const std::vector<Verse>& kjv() {
  static const auto verses = load_kjv();  // throws the install hint when `bible` is missing
  return verses;
}

std::string gpt2_dir() { return gradaccum::testing::gpt2_tokenizer_dir(); }
const Tokenizer& gpt2() {
  static const Tokenizer t = Tokenizer::load(gpt2_dir());
  return t;
}

TEST(TextDataKjv, CountsAndFirstAndLastVerses) {
  const auto& v = kjv();
  ASSERT_EQ(static_cast<int64_t>(v.size()), kKjvVerses);
  int64_t old_testament = 0;
  for (const auto& x : v) old_testament += x.testament == 0;
  EXPECT_EQ(old_testament, 23145);
  EXPECT_EQ(kKjvVerses - old_testament, 7957);

  EXPECT_EQ(verse_reference(v.front()), "Ge1:1");
  EXPECT_EQ(v.front().text, "In the beginning God created the heaven and the earth.");
  EXPECT_EQ(v.front().testament, 0);
  EXPECT_EQ(verse_reference(v.back()), "Rev22:21");
  EXPECT_EQ(v.back().chapter, 22);
  EXPECT_EQ(v.back().verse, 21);
  EXPECT_EQ(v.back().text, "The grace of our Lord Jesus Christ be with you all. Amen.");
  EXPECT_EQ(v.back().testament, 1);
  // The testament boundary: Malachi 4:6, then Matthew 1:1.
  EXPECT_EQ(verse_reference(v[23144]), "Mal4:6");
  EXPECT_EQ(v[23144].testament, 0);
  EXPECT_EQ(verse_reference(v[23145]), "Mat1:1");
  EXPECT_EQ(v[23145].testament, 1);
  EXPECT_EQ(v[23145].text, "The book of the generation of Jesus Christ, the son of David, the son of Abraham.");
}

TEST(TextDataKjv, BrokenInstallsNameThePackage) {
  EXPECT_EQ(error_of([] { load_kjv("/nonexistent/bible"); }),
            "`/nonexistent/bible -f Gen1:1-Rev22:21`: /nonexistent/bible not found; install it "
            "with `apt install bible-kjv bible-kjv-text`");
  EXPECT_EQ(error_of([] { load_kjv("true"); }),
            "`true -f Gen1:1-Rev22:21` printed nothing; install it with `apt install "
            "bible-kjv bible-kjv-text`");
  EXPECT_EQ(error_of([] { load_kjv("false"); }),
            "`false -f Gen1:1-Rev22:21` failed (exit status 1); install it with `apt install "
            "bible-kjv bible-kjv-text`");
  EXPECT_EQ(error_of([] { load_kjv("echo"); }),
            "`echo -f Gen1:1-Rev22:21`: line 1 is not a verse in canonical order (\"-f "
            "Gen1:1-Rev22:21\"); is the KJV text broken? install it with `apt install "
            "bible-kjv bible-kjv-text`");
  // Books out of canonical order are garbage too.
  EXPECT_EQ(error_of([] { parse_kjv_listing("Ge1:1 In the beginning.\nMat1:1 The book.\nGe1:2 And.\n", "x"); }),
            "x: line 3 is not a verse in canonical order (\"Ge1:2 And.\"); is the KJV text "
            "broken? install it with `apt install bible-kjv bible-kjv-text`");
  const auto two = parse_kjv_listing("1Sm3:10 And the LORD came.\n3Jn1:14 But I trust.", "x");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].book, "1Sm");
  EXPECT_EQ(two[0].chapter, 3);
  EXPECT_EQ(two[0].verse, 10);
  EXPECT_EQ(two[1].testament, 1);
}

TEST(TextDataKjv, TestamentSplitSizesAndMajorityBaseline) {
  const auto data = make_kjv_testament_data(kjv(), gpt2(), KjvTestamentOptions{});
  ASSERT_TRUE(data.eval);
  EXPECT_EQ(data.train->size(), 27992);
  EXPECT_EQ(data.eval->size(), 3110);
  // The majority-class baseline quoted in kjv.h: 2314 / 3110 = 74.41% "Old".
  EXPECT_EQ(data.eval->label_counts(), (std::vector<int64_t>{2314, 796}));
  EXPECT_EQ(data.train->label_counts(), (std::vector<int64_t>{20831, 7161}));
  // Verse 9 (Ge1:10) is the first eval example; "Dry land" starts it.
  auto b = data.eval->get(ids({0}), torch::kFloat);
  EXPECT_EQ(
      gpt2().decode(std::vector<TokenId>(b.input.data_ptr<int64_t>(), b.input.data_ptr<int64_t>() + b.input.size(1))),
      kjv()[9].text);
  EXPECT_EQ(b.target.item<int64_t>(), 0);

  KjvTestamentOptions balanced;
  balanced.balanced = true;
  const auto bal = make_kjv_testament_data(kjv(), gpt2(), balanced);
  EXPECT_EQ(bal.eval->label_counts(), (std::vector<int64_t>{796, 796}));
  EXPECT_EQ(bal.train->label_counts(), (std::vector<int64_t>{7161, 7161}));
  // Seeded: the same draw again.
  const auto again = make_kjv_testament_data(kjv(), gpt2(), balanced);
  EXPECT_EQ(again.train->labels(), bal.train->labels());
  EXPECT_EQ(again.train->lengths(), bal.train->lengths());
}

TEST(TextDataKjv, LanguageModelDataPaddedAndPacked) {
  const auto start = std::chrono::steady_clock::now();
  const auto data = make_kjv_lm_data(kjv(), gpt2(), KjvLmOptions{});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  RecordProperty("tokenize_kjv_seconds", std::to_string(seconds));
  std::printf("tokenizing and building the 31102-verse LM data took %.2f s (%lld tokens)\n", seconds,
              static_cast<long long>(data.train->tokens() + data.eval->tokens()));
  ASSERT_TRUE(data.eval);
  EXPECT_EQ(data.train->size(), 27992);
  EXPECT_EQ(data.eval->size(), 3110);
  EXPECT_EQ(data.train->dropped_documents(), 0);
  const int64_t all_tokens = data.train->tokens() + data.eval->tokens();

  // A batch of verses of very different lengths: Σ (len - 1) targets.
  auto b = data.train->get(ids({0, 5, 100, 27991}), torch::kFloat);
  int64_t expected = 0;
  for (int64_t i : {0, 5, 100, 27991}) expected += data.train->lengths()[i] - 1;
  EXPECT_EQ(b.target.slice(1, 1).ne(core::kIgnoreIndex).sum().item<int64_t>(), expected);
  EXPECT_EQ(b.attention_mask.sum().item<int64_t>(), expected + 4);
  EXPECT_EQ(b.input.size(1), b.attention_mask.sum(1).max().item<int64_t>());

  KjvLmOptions packed;
  packed.dataset.packing = true;
  packed.dataset.max_length = 128;
  const auto p = make_kjv_lm_data(kjv(), gpt2(), packed);
  const int64_t eot = *gpt2().token_id("<|endoftext|>");
  // Every verse plus its separator, cut into full blocks of 128.
  const int64_t train_stream = data.train->tokens() + data.train->size();
  EXPECT_EQ(p.train->size(), train_stream / 128);
  EXPECT_EQ(p.train->dropped_tail_tokens(), train_stream % 128);
  EXPECT_EQ(p.train->tokens() + p.eval->tokens() + p.train->dropped_tail_tokens() + p.eval->dropped_tail_tokens(),
            all_tokens + 31102);
  auto first = p.train->get(ids({0}), torch::kFloat);
  const int64_t verse0 = data.train->lengths()[0];
  EXPECT_EQ(first.input[0][verse0].item<int64_t>(), eot);
  EXPECT_TRUE(first.attention_mask.equal(torch::ones({1, 128}, torch::kLong)));

  KjvLmOptions no_eval;
  no_eval.eval_fraction = 0.0;
  const auto all = make_kjv_lm_data(kjv(), gpt2(), no_eval);
  EXPECT_EQ(all.eval, nullptr);
  EXPECT_EQ(all.train->size(), 31102);
  EXPECT_EQ(all.train->tokens(), all_tokens);
}

}  // namespace text_data_test

}  // namespace gradaccum::data
