#include "gradaccum/data/text_classification.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "gradaccum/base/check.h"
#include "gradaccum/data/csv_reader.h"
#include "gradaccum/data/data_split.h"
#include "gradaccum/data/text_file.h"
#include "gradaccum/data/text_lines.h"
#include "gradaccum/data/utf8.h"

namespace gradaccum::data {
namespace {

bool name_ends_with(const std::string& name, std::string_view suffix) {
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool only_whitespace(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; });
}

// A value quoted for a one-line message: JSON's escapes (no raw line break or control byte,
// invalid UTF-8 replaced), and a long one cut (a label column holding a review is a wrong field).
std::string shown_value(const std::string& value) {
  constexpr std::size_t kShown = 40;
  const auto shown = value.size() > kShown ? value.substr(0, kShown) : value;
  return nlohmann::json(shown).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         (value.size() > kShown ? fmt::format(" (cut; {} bytes)", value.size()) : "");
}

// A CSV field written as an integer: digits with an optional '-'.
bool integer_text(std::string_view text) {
  if (!text.empty() && text.front() == '-') text.remove_prefix(1);
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A field written in digits only is a 0-based column index.
bool is_column_index(const std::string& field) {
  return !field.empty() && std::all_of(field.begin(), field.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// What a text or label field is called in messages: "text" or column 1.
std::string field_label(const std::string& field, bool csv) {
  return csv && is_column_index(field) ? "column " + field : shown_value(field);
}

std::vector<LabelledText> read_jsonl_texts(const std::string& path, const LabelledTextOptions& options) {
  const std::string bytes = read_text_file(path);
  std::vector<LabelledText> texts;
  for_each_line(bytes, [&](int64_t number, std::string_view line) {
    if (only_whitespace(line)) return;
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      std::string what = e.what();
      std::replace(what.begin(), what.end(), '\n', ' ');
      throw Error(fmt::format("{}:{}: invalid JSON: {}", path, number, what));
    }
    GA_CHECK(value.is_object(), "{}:{}: expected a JSON object, got {}", path, number, value.type_name());
    LabelledText record;
    record.line = number;
    const auto text = value.find(options.text_field);
    GA_CHECK(text != value.end(), "{}:{}: missing key {} (data.text_field)", path, number,
             shown_value(options.text_field));
    GA_CHECK(text->is_string(), "{}:{}: {} is {}, not a string", path, number, shown_value(options.text_field),
             text->type_name());
    record.text = text->get<std::string>();
    const auto label = value.find(options.label_field);
    GA_CHECK(label != value.end(), "{}:{}: missing key {} (data.label_field)", path, number,
             shown_value(options.label_field));
    if (label->is_string()) {
      record.label = label->get<std::string>();
    } else if (label->is_number_integer()) {
      record.label = label->dump();
      record.integer_label = true;
    } else {
      throw Error(fmt::format("{}:{}: {} is {}; a label is an integer or a string", path, number,
                              shown_value(options.label_field),
                              label->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
    }
    texts.push_back(std::move(record));
  });
  return texts;
}

// The column of `field`: its index, or where the header names it.
std::size_t column_of(const std::string& field, const char* key, const CsvRecord* header, const std::string& path,
                      std::size_t columns, int64_t first_line) {
  if (is_column_index(field)) {
    std::size_t column = 0;
    const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), column);
    GA_CHECK(error == std::errc() && column < columns,
             "key '{}': column {}, but {}:{} has {} field{} (columns are numbered from 0)", key, field, path,
             first_line, columns, columns == 1 ? "" : "s");
    return column;
  }
  GA_CHECK(header != nullptr, "key '{}': {} is a column name, and key 'data.header' says the file has no header row",
           key, shown_value(field));
  const auto& names = header->fields;
  const auto found = std::find(names.begin(), names.end(), field);
  GA_CHECK(found != names.end(), "{}:{}: the header has no column {} ({}); its columns are {}", path, header->line,
           shown_value(field), key, shown_value(fmt::format("{}", fmt::join(names, ","))));
  GA_CHECK(std::find(found + 1, names.end(), field) == names.end(), "{}:{}: the header names two columns {} ({})", path,
           header->line, shown_value(field), key);
  return static_cast<std::size_t>(found - names.begin());
}

std::vector<LabelledText> read_table_texts(const std::string& path, const LabelledTextOptions& options,
                                           char delimiter) {
  const auto records = read_csv(path, delimiter);
  GA_CHECK(!records.empty(), "{}: no labelled texts (the file is empty)", path);
  const bool names = !is_column_index(options.text_field) || !is_column_index(options.label_field);
  const bool has_header = options.header == HeaderRow::present || (options.header == HeaderRow::by_fields && names);
  const CsvRecord* header = has_header ? &records.front() : nullptr;
  const std::size_t columns = records.front().fields.size();
  const int64_t first_line = records.front().line;
  const auto text_column = column_of(options.text_field, "data.text_field", header, path, columns, first_line);
  const auto label_column = column_of(options.label_field, "data.label_field", header, path, columns, first_line);
  GA_CHECK(text_column != label_column, "keys 'data.text_field' and 'data.label_field': both name column {} of {}",
           text_column, path);

  std::vector<LabelledText> texts;
  for (std::size_t r = has_header ? 1 : 0; r < records.size(); ++r) {
    const auto& record = records[r];
    GA_CHECK(record.fields.size() == columns, "{}:{}: {} field{} where {} (line {}) has {}", path, record.line,
             record.fields.size(), record.fields.size() == 1 ? "" : "s", has_header ? "the header" : "the first row",
             first_line, columns);
    LabelledText text;
    text.line = record.line;
    text.text = record.fields[text_column];
    text.label = record.fields[label_column];
    text.integer_label = integer_text(text.label);
    texts.push_back(std::move(text));
  }
  GA_CHECK(!texts.empty(), "{}: no labelled texts (the file has only its header row)", path);
  return texts;
}

// The largest number of classes index labels may claim: one per labelled text. A larger label is
// a broken file, not a classifier of that many classes.
int64_t text_count(const std::vector<LabelledFile>& files) {
  int64_t n = 0;
  for (const auto& f : files) n += static_cast<int64_t>(f.texts.size());
  return n;
}

ClassIds index_classes(const std::vector<LabelledFile>& files) {
  const int64_t texts = text_count(files);
  ClassIds classes;
  int64_t largest = 0;
  for (const auto& file : files) {
    auto& ids = classes.ids.emplace_back();
    for (const auto& t : file.texts) {
      GA_CHECK(t.integer_label, "{}:{}: label {} is not an integer (data.labels: index takes class indices 0 to K-1)",
               file.path, t.line, shown_value(t.label));
      GA_CHECK(t.label.front() != '-',
               "{}:{}: label {} is negative; class indices are 0 to K-1 (data.labels: name makes any values "
               "classes, in sorted order)",
               file.path, t.line, t.label);
      int64_t id = 0;
      const auto [end, error] = std::from_chars(t.label.data(), t.label.data() + t.label.size(), id);
      GA_CHECK(error == std::errc() && id < texts,
               "{}:{}: label {} is not a class index below the {} labelled texts (labels are 0 to K-1 for K classes; "
               "data.labels: name makes any values classes)",
               file.path, t.line, t.label, texts);
      largest = std::max(largest, id);
      ids.push_back(id);
    }
  }
  classes.num_labels = largest + 1;
  GA_CHECK(classes.num_labels >= 2, "{}: every label is 0; classification needs at least two classes",
           files.front().path);
  return classes;
}

ClassIds name_classes(const std::vector<LabelledFile>& files) {
  std::vector<std::string> names;
  bool all_integers = true;
  for (const auto& file : files) {
    for (const auto& t : file.texts) {
      names.push_back(t.label);
      all_integers = all_integers && t.integer_label;
    }
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  if (all_integers) {
    // By value: -1 before 1, 2 before 10. Digits too many for int64 compare by length first.
    std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
      const bool a_negative = a.front() == '-', b_negative = b.front() == '-';
      if (a_negative != b_negative) return a_negative;
      const bool shorter = a.size() != b.size() ? a.size() < b.size() : a < b;
      const bool longer = a.size() != b.size() ? a.size() > b.size() : a > b;
      return a_negative ? longer : shorter;
    });
  }
  GA_CHECK(names.size() >= 2, "{}: every label is {}; classification needs at least two classes", files.front().path,
           shown_value(names.front()));
  ClassIds classes;
  std::map<std::string, int64_t> id_of;
  for (std::size_t i = 0; i < names.size(); ++i) id_of[names[i]] = static_cast<int64_t>(i);
  for (const auto& file : files) {
    auto& ids = classes.ids.emplace_back();
    for (const auto& t : file.texts) ids.push_back(id_of.at(t.label));
  }
  classes.num_labels = static_cast<int64_t>(names.size());
  classes.names = std::move(names);
  return classes;
}

// "a / b" texts per class of `ids` (all of them: a class without texts shows 0).
std::string per_class(const std::vector<int64_t>& ids, const std::vector<int64_t>& which, int64_t num_labels) {
  std::vector<int64_t> counts(static_cast<std::size_t>(num_labels), 0);
  for (const auto i : which) ++counts[static_cast<std::size_t>(ids[static_cast<std::size_t>(i)])];
  return fmt::format("{}", fmt::join(counts, " / "));
}

}  // namespace

const base::EnumNames<TableFormat>& table_format_names() {
  static const base::EnumNames<TableFormat> names{{TableFormat::by_extension, "auto"},
                                                  {TableFormat::jsonl, "jsonl"},
                                                  {TableFormat::csv, "csv"},
                                                  {TableFormat::tsv, "tsv"}};
  return names;
}

const base::EnumNames<HeaderRow>& header_row_names() {
  static const base::EnumNames<HeaderRow> names{
      {HeaderRow::by_fields, "auto"}, {HeaderRow::present, "true"}, {HeaderRow::absent, "false"}};
  return names;
}

const base::EnumNames<LabelKind>& label_kind_names() {
  static const base::EnumNames<LabelKind> names{
      {LabelKind::by_values, "auto"}, {LabelKind::index, "index"}, {LabelKind::name, "name"}};
  return names;
}

TableFormat table_format(const std::string& path, TableFormat format) {
  if (format != TableFormat::by_extension) return format;
  if (name_ends_with(path, ".jsonl") || name_ends_with(path, ".json")) return TableFormat::jsonl;
  if (name_ends_with(path, ".csv")) return TableFormat::csv;
  if (name_ends_with(path, ".tsv") || name_ends_with(path, ".tab")) return TableFormat::tsv;
  throw Error(fmt::format(
      "key 'data.format': {} does not end in .jsonl, .json, .csv, .tsv or .tab; set data.format to jsonl, csv or tsv",
      path));
}

std::vector<LabelledText> read_labelled_text(const std::string& path, const LabelledTextOptions& options) {
  GA_CHECK(options.text_field != options.label_field, "keys 'data.text_field' and 'data.label_field': both are {}",
           shown_value(options.text_field));
  const auto format = table_format(path, options.format);
  auto texts = format == TableFormat::jsonl ? read_jsonl_texts(path, options)
                                            : read_table_texts(path, options, format == TableFormat::csv ? ',' : '\t');
  GA_CHECK(!texts.empty(), "{}: no labelled texts (the file is empty or has only blank lines)", path);
  const bool csv = format != TableFormat::jsonl;
  for (const auto& t : texts) {
    // An empty text has nothing to classify from (and no last token to pool).
    GA_CHECK(!only_whitespace(t.text), "{}:{}: the text ({}) is empty", path, t.line,
             field_label(options.text_field, csv));
    GA_CHECK(!t.label.empty(), "{}:{}: the label ({}) is empty", path, t.line, field_label(options.label_field, csv));
    // A label may become a class name in config.json, which is UTF-8.
    GA_CHECK(is_valid_utf8(t.label), "{}:{}: the label {} is not valid UTF-8", path, t.line, shown_value(t.label));
  }
  return texts;
}

ClassIds assign_classes(const std::vector<LabelledFile>& files, LabelKind kind) {
  GA_CHECK(!files.empty() && !files.front().texts.empty(), "assign_classes: no labelled texts");
  if (kind == LabelKind::by_values) {
    const auto& first_file = files.front();
    const auto& first = first_file.texts.front();
    for (const auto& file : files) {
      for (const auto& t : file.texts) {
        GA_CHECK(t.integer_label == first.integer_label,
                 "{}:{}: label {} is {}, but {}:{} has {} label {}; set data.labels to name (every value a class) or "
                 "index (integers 0 to K-1)",
                 file.path, t.line, shown_value(t.label), t.integer_label ? "an integer" : "a name", first_file.path,
                 first.line, first.integer_label ? "the integer" : "the name", shown_value(first.label));
      }
    }
    kind = first.integer_label ? LabelKind::index : LabelKind::name;
  }
  return kind == LabelKind::index ? index_classes(files) : name_classes(files);
}

ClassificationData make_text_classification_data(const Tokenizer& tokenizer, const TextClassificationOptions& options) {
  std::vector<LabelledFile> files{{options.path, read_labelled_text(options.path, options.fields)}};
  if (!options.eval_path.empty())
    files.push_back({options.eval_path, read_labelled_text(options.eval_path, options.fields)});
  const auto classes = assign_classes(files, options.labels);
  const auto& ids = classes.ids.front();
  const auto split = stratified_split(ids, options.eval_path.empty() ? options.eval_fraction : 0.0,
                                      options.test_fraction, options.seed);

  auto dataset_options = options.dataset;
  dataset_options.num_labels = classes.num_labels;
  int64_t truncated = 0;
  const auto make = [&](const LabelledFile& file, const std::vector<int64_t>& file_ids,
                        const std::vector<int64_t>& which) -> std::shared_ptr<SequenceClassificationDataset> {
    if (which.empty()) return nullptr;
    std::vector<LabelledTokens> examples;
    examples.reserve(which.size());
    for (const auto i : which) {
      const auto k = static_cast<std::size_t>(i);
      examples.push_back({tokenizer.encode(file.texts[k].text), file_ids[k]});
    }
    auto dataset = std::make_shared<SequenceClassificationDataset>(examples, dataset_options);
    truncated += dataset->truncated_examples();
    return dataset;
  };
  ClassificationData data;
  data.num_labels = classes.num_labels;
  data.label_names = classes.names;
  data.train = make(files.front(), ids, split.train);
  GA_CHECK(data.train != nullptr, "{}: eval_fraction and test_fraction leave no text to train on", options.path);
  data.test = make(files.front(), ids, split.test);
  std::string eval_part;
  if (options.eval_path.empty()) {
    data.eval = make(files.front(), ids, split.eval);
    eval_part = fmt::format("eval {} ({})", split.eval.size(), per_class(ids, split.eval, classes.num_labels));
  } else {
    std::vector<int64_t> all(files.back().texts.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    data.eval = make(files.back(), classes.ids.back(), all);
    eval_part = fmt::format("eval {} from {} ({})", all.size(), options.eval_path,
                            per_class(classes.ids.back(), all, classes.num_labels));
  }
  std::string class_names;
  if (!classes.names.empty()) {
    std::vector<std::string> shown;
    for (const auto& name : classes.names) shown.push_back(shown_value(name));
    class_names = fmt::format(" ({})", fmt::join(shown, ", "));
  }
  data.description = fmt::format(
      "{}: {} labelled texts, {} classes{}; per class: train {} ({}), {}, test {} ({}); {} truncated to {} tokens "
      "(their end cut)",
      options.path, ids.size(), classes.num_labels, class_names, split.train.size(),
      per_class(ids, split.train, classes.num_labels), eval_part, split.test.size(),
      per_class(ids, split.test, classes.num_labels), truncated, dataset_options.max_length);
  return data;
}

}  // namespace gradaccum::data
