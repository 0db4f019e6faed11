// A user's text file read whole, as the text readers (text_source.h, csv_reader.h) take it.
#pragma once

#include <string>

namespace gradaccum::data {

// The bytes of the file at `path` without a leading UTF-8 byte order mark (Windows editors write
// one; it is not part of the first document). Throws gradaccum::Error naming the file when it is a
// directory or cannot be read.
std::string read_text_file(const std::string& path);

}  // namespace gradaccum::data
