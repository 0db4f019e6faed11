#include "gradaccum/data/csv_reader.h"

#include <nlohmann/json.hpp>

#include "gradaccum/base/check.h"
#include "gradaccum/data/text_file.h"

namespace gradaccum::data {

std::vector<CsvRecord> parse_csv(std::string_view text, char delimiter, const std::string& file) {
  std::vector<CsvRecord> records;
  const std::size_t n = text.size();
  std::size_t pos = 0;
  int64_t line = 1;
  // A line break at `at`: "\n" or "\r\n"; its length (0: none).
  const auto line_break = [&](std::size_t at) -> std::size_t {
    if (at < n && text[at] == '\n') return 1;
    if (at + 1 < n && text[at] == '\r' && text[at + 1] == '\n') return 2;
    return 0;
  };
  while (pos < n) {
    if (const auto skip = line_break(pos)) {  // an empty line holds no record
      pos += skip;
      ++line;
      continue;
    }
    CsvRecord record;
    record.line = line;
    bool record_ends = false;
    while (!record_ends) {
      std::string field;
      if (pos < n && text[pos] == '"') {
        const int64_t opened = line;
        ++pos;
        while (true) {
          GA_CHECK(pos < n, "{}:{}: a quoted field opened on this line is never closed", file, opened);
          const char c = text[pos];
          if (c == '"') {
            if (pos + 1 < n && text[pos + 1] == '"') {  // "" inside quotes is one quote
              field += '"';
              pos += 2;
              continue;
            }
            ++pos;
            break;
          }
          if (c == '\n') ++line;
          field += c;
          ++pos;
        }
        // Only the delimiter or the end of the record may follow the closing quote.
        if (pos == n) {
          record_ends = true;
        } else if (text[pos] == delimiter) {
          ++pos;
        } else if (const auto skip = line_break(pos)) {
          pos += skip;
          ++line;
          record_ends = true;
        } else {
          throw Error(fmt::format(
              "{}:{}: a field's closing quote is followed by {}, not the delimiter or the line's end (a quote "
              "inside a quoted field is written \"\")",
              file, line,
              nlohmann::json(std::string(1, text[pos]))
                  .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
        }
      } else {
        const std::size_t begin = pos;
        while (pos < n && text[pos] != delimiter && text[pos] != '\n') ++pos;
        std::size_t end = pos;
        if (pos < n && text[pos] == '\n' && end > begin && text[end - 1] == '\r') --end;  // "\r\n"
        field.assign(text.substr(begin, end - begin));
        if (pos == n) {
          record_ends = true;
        } else if (text[pos] == delimiter) {
          ++pos;
        } else {
          ++pos;  // '\n'
          ++line;
          record_ends = true;
        }
      }
      record.fields.push_back(std::move(field));
    }
    records.push_back(std::move(record));
  }
  return records;
}

std::vector<CsvRecord> read_csv(const std::string& path, char delimiter) {
  return parse_csv(read_text_file(path), delimiter, path);
}

}  // namespace gradaccum::data
