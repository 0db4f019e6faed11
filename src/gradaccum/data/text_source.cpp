#include "gradaccum/data/text_source.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "gradaccum/base/check.h"
#include "gradaccum/data/text_file.h"
#include "gradaccum/data/text_lines.h"

namespace gradaccum::data {
namespace {

using nlohmann::json;

bool is_blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; });
}

// Parser messages may quote the line; an error message stays one line.
std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  std::replace(text.begin(), text.end(), '\r', ' ');
  return text;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  GA_CHECK(!std::filesystem::is_directory(path, ec), "{}: is a directory, not a text file", path);
  std::ifstream in(path, std::ios::binary);
  GA_CHECK(in, "{}: cannot open: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  GA_CHECK(!in.bad(), "{}: read error", path);
  std::string bytes = text.str();
  if (bytes.rfind("\xEF\xBB\xBF", 0) == 0) bytes.erase(0, 3);
  return bytes;
}

std::vector<TextRecord> read_text_lines(const std::string& path) {
  const std::string bytes = read_text_file(path);
  std::vector<TextRecord> records;
  for_each_line(bytes, [&](int64_t, std::string_view line) {
    if (!is_blank(line)) records.push_back({std::string(line), -1});
  });
  GA_CHECK(!records.empty(), "{}: no documents (the file is empty or has only blank lines)", path);
  return records;
}

std::vector<TextRecord> read_jsonl_records(const std::string& path) {
  const std::string bytes = read_text_file(path);
  std::vector<TextRecord> records;
  int64_t first_labelled = 0, first_unlabelled = 0;  // line numbers, 0 = none yet
  for_each_line(bytes, [&](int64_t number, std::string_view line) {
    if (is_blank(line)) return;
    json value;
    try {
      value = json::parse(line);
    } catch (const json::exception& e) {
      throw Error(one_line(fmt::format("{}:{}: invalid JSON: {}", path, number, e.what())));
    }
    GA_CHECK(value.is_object(), "{}:{}: expected a JSON object like {{\"text\": ...}}, got {}", path, number,
             value.type_name());
    const auto text = value.find("text");
    GA_CHECK(text != value.end(), "{}:{}: missing key \"text\"", path, number);
    GA_CHECK(text->is_string(), "{}:{}: \"text\" is {}, not a string", path, number, text->type_name());
    TextRecord record{text->get<std::string>(), -1};
    const auto label = value.find("label");
    if (label != value.end()) {
      GA_CHECK(label->is_number_integer(), "{}:{}: \"label\" is {}, not an integer", path, number,
               one_line(label->dump()));
      record.label = label->get<int64_t>();
      GA_CHECK(record.label >= 0, "{}:{}: \"label\" is {}; labels are integers >= 0", path, number, record.label);
      if (first_labelled == 0) first_labelled = number;
    } else if (first_unlabelled == 0) {
      first_unlabelled = number;
    }
    GA_CHECK(first_labelled == 0 || first_unlabelled == 0,
             "{}:{}: {} \"label\" but line {} {}; label every line or none", path, number,
             record.label >= 0 ? "has a" : "has no", record.label >= 0 ? first_unlabelled : first_labelled,
             record.label >= 0 ? "has none" : "has one");
    records.push_back(std::move(record));
  });
  GA_CHECK(!records.empty(), "{}: no documents (the file is empty or has only blank lines)", path);
  return records;
}

std::vector<TextRecord> read_text_records(const std::string& path) {
  return ends_with(path, ".jsonl") || ends_with(path, ".json") ? read_jsonl_records(path) : read_text_lines(path);
}

std::vector<std::vector<TokenId>> encode_records(const Tokenizer& tokenizer, const std::vector<TextRecord>& records) {
  std::vector<std::vector<TokenId>> ids;
  ids.reserve(records.size());
  for (const auto& r : records) ids.push_back(tokenizer.encode(r.text));
  return ids;
}

}  // namespace gradaccum::data
