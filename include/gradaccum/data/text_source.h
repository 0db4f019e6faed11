// Documents from a user's text file: plain text (one document per non-empty
// line) or JSON lines ({"text": ...} or {"text": ..., "label": int} per line).
// Lines end in "\n" or "\r\n"; a leading UTF-8 byte order mark is skipped.
// Errors are gradaccum::Error naming the file and the 1-based line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gradaccum/data/tokenizer.h"

namespace gradaccum::data {

struct TextRecord {
  std::string text;
  int64_t label = -1;  // -1: unlabelled
};

// Plain text: every line holding anything but whitespace is a document, without
// its line ending ("\n" or "\r\n"); the text is kept as is otherwise.
std::vector<TextRecord> read_text_lines(const std::string& path);

// JSON lines: blank lines are skipped; every other line is a JSON object with a
// string "text" and optionally an integer "label" >= 0 (other keys are
// ignored). Either every line has a label or none has.
std::vector<TextRecord> read_jsonl_records(const std::string& path);

// read_jsonl_records for names ending in .jsonl or .json, read_text_lines otherwise.
std::vector<TextRecord> read_text_records(const std::string& path);

// The token ids of each record's text (no special tokens added).
std::vector<std::vector<TokenId>> encode_records(const Tokenizer& tokenizer, const std::vector<TextRecord>& records);

}  // namespace gradaccum::data
