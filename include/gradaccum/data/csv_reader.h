// Comma- and tab-separated tables (.csv, .tsv) as RFC 4180 writes them: a record per line, fields
// split by the delimiter; a field that starts with a double quote is quoted, and may then hold the
// delimiter, line breaks, and quotes written twice (""). A quote inside an unquoted field is kept as
// a character, as Python's csv module and pandas keep it. Records end in "\n" or "\r\n"; empty lines
// between records are skipped; a leading UTF-8 byte order mark is not part of the first field.
// Errors are gradaccum::Error naming the file and the 1-based line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gradaccum::data {

struct CsvRecord {
  int64_t line = 0;  // the 1-based line the record starts on (a quoted line break spans lines)
  std::vector<std::string> fields;
};

// The records of `text`; `file` names it in errors: a quote that is never closed (the line it
// opened on), and anything but the delimiter or the line's end after a closing quote. Records may
// have different numbers of fields (the caller knows what it expects).
std::vector<CsvRecord> parse_csv(std::string_view text, char delimiter, const std::string& file);

// parse_csv of the file at `path`, its byte order mark removed. Errors name the file: one that
// cannot be read, a directory.
std::vector<CsvRecord> read_csv(const std::string& path, char delimiter);

}  // namespace gradaccum::data
