// Text classification from a user's files (data.type text_classification): labelled texts in JSON
// lines, CSV or TSV, their labels made class ids, a seeded stratified train / eval / test split, and
// the tokenized datasets (classification_dataset.h: truncated at the end to max_length tokens, as
// HF tokenizers truncate by default, and padded per micro-batch).
//
// Fields. In JSON lines a field is a key of each line's object. In CSV and TSV it is a column: its
// name in the header row, or its 0-based index (a field written in digits only). The header:
// auto: the first row is one when either field is a name, else there is none; present: the first
// row is skipped (its names resolve the fields); absent: every row is data, and the fields must be
// indices.
//
// Labels. index: integers 0..K-1 are the classes (K = the largest + 1); a label that is negative or
// not below the number of labelled texts is refused before anything of size K exists. name: each
// distinct value is a class, the classes in sorted order (by value when every label is an integer,
// as -1 before 1, else by bytes); the names are the model's id2label. auto: index when every label
// is an integer (a JSON integer, or a CSV field of digits with an optional '-'), name when every
// label is a string that is not one; a file that mixes the two is refused (say which is meant).
//
// Errors are gradaccum::Error naming the file and the 1-based line, or the key at fault.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gradaccum/base/enum_names.h"
#include "gradaccum/data/classification_dataset.h"
#include "gradaccum/data/tokenizer.h"

namespace gradaccum::data {

enum class TableFormat { by_extension, jsonl, csv, tsv };
enum class HeaderRow { by_fields, present, absent };
enum class LabelKind { by_values, index, name };
// The configuration's spellings: data.format "auto" | "jsonl" | "csv" | "tsv"; data.header
// "auto" | "true" | "false"; data.labels "auto" | "index" | "name".
const base::EnumNames<TableFormat>& table_format_names();
const base::EnumNames<HeaderRow>& header_row_names();
const base::EnumNames<LabelKind>& label_kind_names();

// `format`, or for by_extension the one that `path` ends in: .jsonl or .json, .csv, .tsv or .tab;
// another name is an error naming the file and the key 'data.format'.
TableFormat table_format(const std::string& path, TableFormat format);

struct LabelledTextOptions {
  TableFormat format = TableFormat::by_extension;
  std::string text_field = "text";
  std::string label_field = "label";
  HeaderRow header = HeaderRow::by_fields;  // CSV and TSV
};

struct LabelledText {
  std::string text;
  std::string label;           // as written: a JSON string's value, a JSON integer's digits, a CSV field
  bool integer_label = false;  // a JSON integer, or a CSV field of digits with an optional '-'
  int64_t line = 0;            // the 1-based line its record starts on
};

// The labelled texts of the file at `path`, in file order; blank JSON lines and empty CSV lines are
// skipped. Refused, naming the file and line: a missing field (a JSON key, a header name, a column
// beyond the row), a text that is empty or only whitespace, an empty label, a JSON label that is
// neither an integer nor a string, a CSV row with another number of fields than the first row, a
// CSV quote that is never closed; and a file without one labelled text.
std::vector<LabelledText> read_labelled_text(const std::string& path, const LabelledTextOptions& options);

struct LabelledFile {
  std::string path;
  std::vector<LabelledText> texts;
};

struct ClassIds {
  std::vector<std::vector<int64_t>> ids;  // [file][text]: the class of each text
  int64_t num_labels = 0;
  std::vector<std::string> names;  // class id -> label (name labels); empty for index labels
};

// The classes of the texts of every file together (the training file and an evaluation file share
// their classes), as the header comment says.
ClassIds assign_classes(const std::vector<LabelledFile>& files, LabelKind kind);

struct TextClassificationOptions {
  std::string path;       // the training texts
  std::string eval_path;  // "" = split eval_fraction off `path`
  LabelledTextOptions fields;
  LabelKind labels = LabelKind::by_values;
  double eval_fraction = 0.1;            // of `path`, without eval_path
  double test_fraction = 0.0;            // of `path`: the test split, evaluated once at the end
  uint64_t seed = 0;                     // the split's shuffle
  ClassificationDatasetOptions dataset;  // max_length and pad_token_id (num_labels is the data's)
};

// Reads, labels, splits (data_split.h's stratified_split: a function of the labels, the fractions
// and the seed, so every b × N × W trains and evaluates on the same texts) and tokenizes (no special
// tokens added). `description` says what each split holds per class and how many texts were cut.
ClassificationData make_text_classification_data(const Tokenizer& tokenizer, const TextClassificationOptions& options);

}  // namespace gradaccum::data
