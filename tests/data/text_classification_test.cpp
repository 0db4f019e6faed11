// Text classification data (data/text_classification.h, csv_reader.h, data_split.h): RFC 4180 CSV
// (a byte order mark, quoted commas, quotes and line breaks), TSV and JSON lines read by field
// name or column index, labels as class indices or names in sorted order, the stratified split's
// counts per class, truncation at max_length, the movie reviews, and each refusal naming the
// file and line.
//
// The tokenizing tests need the GPT-2 vocabulary and the reviews test Pang & Lee's reviews, both
// installed by scripts/setup.sh; without them they FAIL with the install hint.
#include "gradaccum/data/text_classification.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gradaccum/base/check.h"
#include "gradaccum/data/csv_reader.h"
#include "gradaccum/data/data_split.h"
#include "gradaccum/data/tokenizer.h"
#include "test_support.h"

namespace gradaccum::data {
namespace text_classification_test {

namespace fs = std::filesystem;
using gradaccum::testing::error_of;

class TextClassificationFiles : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& content) {
    const auto path = (fs::path(dir_) / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  std::string dir_ = gradaccum::testing::make_temp_dir("text-classification");
};

LabelledTextOptions fields(const std::string& text, const std::string& label, HeaderRow header = HeaderRow::by_fields) {
  LabelledTextOptions o;
  o.text_field = text;
  o.label_field = label;
  o.header = header;
  return o;
}

// ---------------------------------------------------------------- reading

TEST_F(TextClassificationFiles, CsvWithAByteOrderMarkAndQuotedFields) {
  const auto path = write("reviews.csv",
                          "\xEF\xBB\xBF"
                          "label,text\r\n"
                          "pos,\"good, even great\"\r\n"
                          "neg,\"a \"\"so-called\"\" comedy\"\r\n"
                          "\r\n"
                          "pos,\"two\nlines, \"\"quoted\"\"\"\r\n"
                          "neg,plain \"inner\" quotes\n"
                          "pos,\"last, no line break\"");
  const auto records = read_csv(path, ',');
  ASSERT_EQ(records.size(), 6u);
  EXPECT_EQ(records[0].fields, (std::vector<std::string>{"label", "text"}));  // the mark is not in "label"
  EXPECT_EQ(records[1].fields, (std::vector<std::string>{"pos", "good, even great"}));
  EXPECT_EQ(records[2].fields[1], "a \"so-called\" comedy");
  EXPECT_EQ(records[3].fields[1], "two\nlines, \"quoted\"");
  EXPECT_EQ(records[4].fields[1], "plain \"inner\" quotes");
  EXPECT_EQ(records[5].fields[1], "last, no line break");
  // Lines count the file's lines: the empty line 4 is skipped, the quoted line break spans 5-6.
  std::vector<int64_t> lines;
  for (const auto& r : records) lines.push_back(r.line);
  EXPECT_EQ(lines, (std::vector<int64_t>{1, 2, 3, 5, 7, 8}));

  const auto texts = read_labelled_text(path, fields("text", "label"));
  ASSERT_EQ(texts.size(), 5u);
  EXPECT_EQ(texts[0].text, "good, even great");
  EXPECT_EQ(texts[0].label, "pos");
  EXPECT_FALSE(texts[0].integer_label);
  EXPECT_EQ(texts[2].text, "two\nlines, \"quoted\"");
  EXPECT_EQ(texts[2].line, 5);
  EXPECT_EQ(texts[4].line, 8);
  // By column index, the header row skipped on request.
  const auto by_index = read_labelled_text(path, fields("1", "0", HeaderRow::present));
  ASSERT_EQ(by_index.size(), 5u);
  EXPECT_EQ(by_index[1].text, "a \"so-called\" comedy");
  EXPECT_EQ(by_index[1].label, "neg");
}

TEST_F(TextClassificationFiles, TsvAndEmptyLastFields) {
  const auto path = write("data.tsv", "3\tthe first\t\n1\t\"quoted\ttab\"\tx\n-2\tplain\t\n");
  const auto texts = read_labelled_text(path, fields("1", "0"));  // indices: no header row
  ASSERT_EQ(texts.size(), 3u);
  EXPECT_EQ(texts[0].text, "the first");
  EXPECT_EQ(texts[0].label, "3");
  EXPECT_TRUE(texts[0].integer_label);
  EXPECT_EQ(texts[1].text, "quoted\ttab");
  EXPECT_EQ(texts[2].label, "-2");
  EXPECT_TRUE(texts[2].integer_label);
  EXPECT_EQ(parse_csv("a\t\tc\t\n", '\t', "x").front().fields, (std::vector<std::string>{"a", "", "c", ""}));
  EXPECT_EQ(table_format("a/b.tab", TableFormat::by_extension), TableFormat::tsv);
  EXPECT_EQ(table_format("a/b.txt", TableFormat::csv), TableFormat::csv);
}

TEST_F(TextClassificationFiles, JsonLinesByKey) {
  const auto path = write("data.jsonl",
                          "{\"review\": \"fine\", \"stars\": 4}\n\n"
                          "{\"review\": \"dull\\nand long\", \"stars\": 1, \"other\": null}\n"
                          "{\"review\": \"ok\", \"stars\": \"3\"}\n");
  const auto texts = read_labelled_text(path, fields("review", "stars"));
  ASSERT_EQ(texts.size(), 3u);
  EXPECT_EQ(texts[0].text, "fine");
  EXPECT_EQ(texts[0].label, "4");
  EXPECT_TRUE(texts[0].integer_label);
  EXPECT_EQ(texts[1].text, "dull\nand long");
  EXPECT_EQ(texts[1].line, 3);
  EXPECT_EQ(texts[2].label, "3");  // a JSON string, though its characters are digits
  EXPECT_FALSE(texts[2].integer_label);
}

// ---------------------------------------------------------------- labels

LabelledText labelled(const std::string& label, bool integer, int64_t line) { return {"t", label, integer, line}; }

TEST(TextClassificationLabels, NamesAreClassesInSortedOrder) {
  const std::vector<LabelledFile> files = {
      {"train.csv", {labelled("pos", false, 2), labelled("neg", false, 3), labelled("neutral", false, 4)}},
      {"eval.csv", {labelled("neg", false, 2), labelled("Pos", false, 3)}}};
  const auto classes = assign_classes(files, LabelKind::by_values);
  EXPECT_EQ(classes.names, (std::vector<std::string>{"Pos", "neg", "neutral", "pos"}));  // by bytes
  EXPECT_EQ(classes.num_labels, 4);
  EXPECT_EQ(classes.ids[0], (std::vector<int64_t>{3, 1, 2}));
  EXPECT_EQ(classes.ids[1], (std::vector<int64_t>{1, 0}));
  // Integers taken as names sort by value: -1 before 1, 2 before 10.
  const std::vector<LabelledFile> stars = {
      {"s.csv", {labelled("10", true, 1), labelled("-1", true, 2), labelled("2", true, 3), labelled("-10", true, 4)}}};
  const auto by_value = assign_classes(stars, LabelKind::name);
  EXPECT_EQ(by_value.names, (std::vector<std::string>{"-10", "-1", "2", "10"}));
  EXPECT_EQ(by_value.ids[0], (std::vector<int64_t>{3, 1, 2, 0}));
}

TEST(TextClassificationLabels, IntegersAreClassIndices) {
  const std::vector<LabelledFile> files = {
      {"a.jsonl", {labelled("2", true, 1), labelled("0", true, 2), labelled("0", true, 3)}},
      {"b.jsonl", {labelled("1", true, 1)}}};
  const auto classes = assign_classes(files, LabelKind::by_values);
  EXPECT_EQ(classes.num_labels, 3);
  EXPECT_TRUE(classes.names.empty());  // id2label stays HF's LABEL_0, LABEL_1, ...
  EXPECT_EQ(classes.ids[0], (std::vector<int64_t>{2, 0, 0}));
  EXPECT_EQ(classes.ids[1], (std::vector<int64_t>{1}));
}

TEST(TextClassificationLabels, ImpossibleIndicesAndMixedKindsAreRefused) {
  const auto refusal = [](std::vector<LabelledText> texts, LabelKind kind) {
    return error_of([&] { assign_classes({{"f.csv", std::move(texts)}}, kind); });
  };
  // A label far beyond the texts is refused before anything of its size exists.
  EXPECT_EQ(refusal({labelled("0", true, 1), labelled("1000000000000000", true, 2)}, LabelKind::by_values),
            "f.csv:2: label 1000000000000000 is not a class index below the 2 labelled texts (labels are 0 to K-1 for "
            "K classes; data.labels: name makes any values classes)");
  EXPECT_EQ(refusal({labelled("0", true, 1), labelled("99999999999999999999999", true, 2)}, LabelKind::index),
            "f.csv:2: label 99999999999999999999999 is not a class index below the 2 labelled texts (labels are 0 to "
            "K-1 for K classes; data.labels: name makes any values classes)");
  EXPECT_EQ(refusal({labelled("1", true, 1), labelled("-1", true, 7)}, LabelKind::by_values),
            "f.csv:7: label -1 is negative; class indices are 0 to K-1 (data.labels: name makes any values classes, "
            "in sorted order)");
  EXPECT_EQ(refusal({labelled("1", true, 1), labelled("pos", false, 3)}, LabelKind::by_values),
            "f.csv:3: label \"pos\" is a name, but f.csv:1 has the integer label \"1\"; set data.labels to name "
            "(every value a class) or index (integers 0 to K-1)");
  EXPECT_EQ(refusal({labelled("1", true, 1), labelled("pos", false, 3)}, LabelKind::index),
            "f.csv:3: label \"pos\" is not an integer (data.labels: index takes class indices 0 to K-1)");
  EXPECT_EQ(refusal({labelled("0", true, 1), labelled("0", true, 2)}, LabelKind::index),
            "f.csv: every label is 0; classification needs at least two classes");
  EXPECT_EQ(refusal({labelled("pos", false, 1), labelled("pos", false, 2)}, LabelKind::name),
            "f.csv: every label is \"pos\"; classification needs at least two classes");
}

// ---------------------------------------------------------------- split

TEST(TextClassificationSplit, StratifiedCountsPerClassForASeed) {
  // Classes of 5, 7 and 13 items, interleaved. eval 0.2 of 25 = 5: shares 1.0, 1.4, 2.6 -> floors
  // 1, 1, 2 and the one left to the largest remainder (class 2). test 0.32 of 25 = 8: shares 1.6,
  // 2.24, 4.16 -> 1, 2, 4 and one more to class 0.
  const std::vector<int64_t> labels = {0, 1, 1, 2, 2, 0, 1, 1, 2, 2, 0, 1, 2, 2, 2, 0, 1, 2, 2, 2, 0, 1, 2, 2, 2};
  const auto count = [&](const std::vector<int64_t>& items) {
    std::vector<int64_t> c(3, 0);
    for (auto i : items) ++c[static_cast<std::size_t>(labels[static_cast<std::size_t>(i)])];
    return c;
  };
  const auto s = stratified_split(labels, 0.2, 0.32, 11);
  EXPECT_EQ(count(s.eval), (std::vector<int64_t>{1, 1, 3}));
  EXPECT_EQ(count(s.test), (std::vector<int64_t>{2, 2, 4}));
  EXPECT_EQ(count(s.train), (std::vector<int64_t>{2, 4, 6}));
  std::vector<int64_t> all;
  for (const auto* part : {&s.train, &s.eval, &s.test}) {
    EXPECT_TRUE(std::is_sorted(part->begin(), part->end()));
    all.insert(all.end(), part->begin(), part->end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> every(25);
  for (int64_t i = 0; i < 25; ++i) every[static_cast<std::size_t>(i)] = i;
  EXPECT_EQ(all, every);  // disjoint, and nothing lost

  // A function of the labels, the fractions and the seed: the same again, another with another seed.
  const auto again = stratified_split(labels, 0.2, 0.32, 11);
  EXPECT_EQ(again.train, s.train);
  EXPECT_EQ(again.eval, s.eval);
  EXPECT_EQ(again.test, s.test);
  const auto other = stratified_split(labels, 0.2, 0.32, 12);
  EXPECT_EQ(count(other.test), count(s.test));
  EXPECT_NE(other.test, s.test);

  EXPECT_EQ(error_of([&] { stratified_split(labels, 0.5, 0.5, 1); }),
            "stratified split: eval_fraction 0.5 and test_fraction 0.5 must be >= 0 with a sum below 1");
}

// ---------------------------------------------------------------- datasets

const Tokenizer& gpt2() {
  static const Tokenizer t = Tokenizer::load(gradaccum::testing::gpt2_tokenizer_dir());
  return t;
}

TEST_F(TextClassificationFiles, TokenizedAndTruncatedAtTheEnd) {
  const auto path = write("t.csv",
                          "text,label\n"
                          "a b c d e f,pos\n"
                          "g h,neg\n"
                          "i j k l,pos\n");
  TextClassificationOptions o;
  o.path = path;
  o.eval_fraction = 0;
  o.dataset.max_length = 4;
  o.dataset.pad_token_id = 50256;
  const auto data = make_text_classification_data(gpt2(), o);
  ASSERT_NE(data.train, nullptr);
  EXPECT_EQ(data.eval, nullptr);
  EXPECT_EQ(data.test, nullptr);
  EXPECT_EQ(data.num_labels, 2);
  EXPECT_EQ(data.label_names, (std::vector<std::string>{"neg", "pos"}));
  ASSERT_EQ(data.train->size(), 3);
  EXPECT_EQ(data.train->lengths(), (std::vector<int64_t>{4, 2, 4}));  // 6 tokens cut to 4; 2; 4
  EXPECT_EQ(data.train->truncated_examples(), 1);
  const auto batch = data.train->get(torch::tensor({0, 1}), torch::kFloat);
  const auto first = gpt2().encode("a b c d");  // the start is kept
  ASSERT_EQ(first.size(), 4u);
  for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(batch.input[0][k].item<int64_t>(), first[static_cast<std::size_t>(k)]);
  EXPECT_EQ(batch.input[1][2].item<int64_t>(), 50256);  // padded to the micro-batch's longest row
  EXPECT_EQ(batch.attention_mask[1][2].item<int64_t>(), 0);
  EXPECT_TRUE(batch.target.equal(torch::tensor({1, 0}, torch::kLong)));
  EXPECT_EQ(data.description, path +
                                  ": 3 labelled texts, 2 classes (\"neg\", \"pos\"); per class: train 3 (1 / 2), eval "
                                  "0 (0 / 0), test 0 (0 / 0); 1 truncated to 4 tokens (their end cut)");
}

// ---------------------------------------------------------------- refusals

TEST_F(TextClassificationFiles, EachRefusalNamesTheFileAndLine) {
  struct Case {
    std::string name, content, text_field, label_field, message;
  };
  const std::vector<Case> cases = {
      {"missing.jsonl", "{\"text\": \"a\", \"label\": 0}\n{\"txt\": \"b\", \"label\": 1}\n", "text", "label",
       ":2: missing key \"text\" (data.text_field)"},
      {"missing-label.jsonl", "{\"text\": \"a\", \"label\": 0}\n{\"text\": \"b\"}\n", "text", "label",
       ":2: missing key \"label\" (data.label_field)"},
      {"missing-column.csv", "label,review\n1,a\n", "text", "label",
       ":1: the header has no column \"text\" (data.text_field); its columns are \"label,review\""},
      {"empty.csv", "text,label\na,1\n\"\",0\n", "text", "label", ":3: the text (\"text\") is empty"},
      {"blank.tsv", "1\tfine\n0\t  \n", "1", "0", ":2: the text (column 1) is empty"},
      {"empty.jsonl", "{\"text\": \"\", \"label\": \"pos\"}\n", "text", "label", ":1: the text (\"text\") is empty"},
      {"float.jsonl", "{\"text\": \"a\", \"label\": 0}\n{\"text\": \"b\", \"label\": 1.5}\n", "text", "label",
       ":2: \"label\" is 1.5; a label is an integer or a string"},
      {"null.jsonl", "{\"text\": \"a\", \"label\": null}\n", "text", "label",
       ":1: \"label\" is null; a label is an integer or a string"},
      {"list.jsonl", "{\"text\": \"a\", \"label\": [1]}\n", "text", "label",
       ":1: \"label\" is [1]; a label is an integer or a string"},
      {"columns.csv", "text,label\na,1\n\"b, c\",0,extra\n", "text", "label",
       ":3: 3 fields where the header (line 1) has 2"},
      {"columns.tsv", "1\ta\n0\n", "1", "0", ":2: 1 field where the first row (line 1) has 2"},
      {"unterminated.csv", "text,label\na,1\n\"never\nclosed,0\nc,1\n", "text", "label",
       ":3: a quoted field opened on this line is never closed"},
      {"after-quote.csv", "text,label\n\"a\"b,1\n", "text", "label",
       ":2: a field's closing quote is followed by \"b\", not the delimiter or the line's end (a quote inside a "
       "quoted field is written \"\")"},
      {"empty-label.csv", "text,label\na,\n", "text", "label", ":2: the label (\"label\") is empty"},
      {"invalid.jsonl", "{\"text\": \"a\", \"label\": 0}\n{\"text\": \"b\"\n", "text", "label",
       ":2: invalid JSON: [json.exception.parse_error.101]"},
  };
  for (const auto& c : cases) {
    const auto path = write(c.name, c.content);
    const auto message = error_of([&] { read_labelled_text(path, fields(c.text_field, c.label_field)); });
    EXPECT_EQ(message.rfind(path + c.message, 0), 0u) << c.name << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  // Files and keys.
  const auto header_only = write("header.csv", "text,label\n");
  EXPECT_EQ(error_of([&] { read_labelled_text(header_only, fields("text", "label")); }),
            header_only + ": no labelled texts (the file has only its header row)");
  EXPECT_EQ(error_of([&] { read_labelled_text(dir_ + "/reviews.txt", fields("text", "label")); }),
            "key 'data.format': " + dir_ +
                "/reviews.txt does not end in .jsonl, .json, .csv, .tsv or .tab; set data.format to jsonl, csv or tsv");
  const auto two = write("two.csv", "a,b\n1,x\n");
  EXPECT_EQ(error_of([&] { read_labelled_text(two, fields("5", "0")); }),
            "key 'data.text_field': column 5, but " + two + ":1 has 2 fields (columns are numbered from 0)");
  EXPECT_EQ(error_of([&] { read_labelled_text(two, fields("b", "a", HeaderRow::absent)); }),
            "key 'data.text_field': \"b\" is a column name, and key 'data.header' says the file has no header row");
  EXPECT_EQ(error_of([&] { read_labelled_text(two, fields("b", "b")); }),
            "keys 'data.text_field' and 'data.label_field': both are \"b\"");
}

// ---------------------------------------------------------------- the movie reviews

const std::string kReviews = "/var/lib/gradaccum/data/movie-reviews/reviews.csv";

TEST(TextClassificationReviews, PangAndLeesReviewsAreTwoBalancedClasses) {
  ASSERT_TRUE(fs::exists(kReviews)) << kReviews << " is missing: run scripts/setup.sh";
  // Header-less: column 0 the label (1 or -1, quoted), column 1 the review, with line breaks.
  const auto texts = read_labelled_text(kReviews, fields("1", "0"));
  ASSERT_EQ(texts.size(), 1500u);
  EXPECT_EQ(texts.front().text.rfind("films adapted from comic books have had plenty of success", 0), 0u);
  EXPECT_EQ(error_of([&] { assign_classes({{kReviews, texts}}, LabelKind::by_values); }).find(kReviews + ":"), 0u);
  const auto classes = assign_classes({{kReviews, texts}}, LabelKind::name);
  EXPECT_EQ(classes.names, (std::vector<std::string>{"-1", "1"}));
  std::vector<int64_t> counts(2, 0);
  for (auto id : classes.ids[0]) ++counts[static_cast<std::size_t>(id)];
  EXPECT_EQ(counts, (std::vector<int64_t>{750, 750}));
  // Seed 001's shape: 1,200 / 100 / 200, each half positive.
  const auto split = stratified_split(classes.ids[0], 100.0 / 1500, 200.0 / 1500, 42);
  EXPECT_EQ(split.train.size(), 1200u);
  EXPECT_EQ(split.eval.size(), 100u);
  EXPECT_EQ(split.test.size(), 200u);
  int64_t positive_test = 0;
  for (auto i : split.test) positive_test += classes.ids[0][static_cast<std::size_t>(i)];
  EXPECT_EQ(positive_test, 100);
}

}  // namespace text_classification_test
}  // namespace gradaccum::data
