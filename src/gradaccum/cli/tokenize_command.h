// `gradaccum tokenize [--tokenizer DIR] [--decode] [FILE]`
#pragma once

#include <string>

namespace gradaccum::cli {

struct TokenizeArgs {
  std::string tokenizer_dir;  // "" = $GRADACCUM_TOKENIZER_DIR, else data::kDefaultTokenizerDir
  std::string input_path;     // "" or "-" = standard input
  bool decode = false;
};

// Encodes each input line (the bytes between newlines) and prints its ids as
// one JSON array per line; with decode, reads such arrays and prints the text.
// Returns the process exit code; throws gradaccum::Error on bad input.
int run_tokenize(const TokenizeArgs& args);

}  // namespace gradaccum::cli
