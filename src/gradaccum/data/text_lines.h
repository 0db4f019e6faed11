// Splitting text into lines, as every line-oriented reader here does (text and JSONL files,
// the KJV listing, .tiktoken files).
#pragma once

#include <cstdint>
#include <string_view>

namespace gradaccum::data {

// Calls f(line_number, line) for each line of `text`, numbered from 1, without its "\n" or
// "\r\n". A last line without "\n" is a line; nothing follows a final "\n".
template <typename F>
void for_each_line(std::string_view text, F&& f) {
  int64_t number = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    f(++number, line);
    pos = end + 1;
  }
}

}  // namespace gradaccum::data
