// Cuts text at a tokenizer.json's added tokens before pre-tokenization, as
// Hugging Face tokenizers' AddedVocabulary does.
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gradaccum/data/tokenizer.h"

namespace gradaccum::data {

// A piece of the text: text to pre-tokenize, or an added token's id.
struct TextSection {
  std::string_view text;
  std::optional<TokenId> id;
};

// Two passes, as tokenizers makes them: first the tokens with normalized false
// are found in the text, then those with normalized true in the text between
// (with no normalizer the order is their only difference). Within a pass the
// leftmost match wins, the longest among those that start there, and the
// search goes on after it. A single_word token is skipped where a word
// character (Rust's char::is_alphanumeric, or '_') touches either end; lstrip
// and rstrip take the White_Space before and after it into the token's section.
// special does not change where tokens are found.
class AddedTokenSplitter {
 public:
  explicit AddedTokenSplitter(const std::vector<AddedToken>& tokens);

  bool empty() const { return non_normalized_.empty() && normalized_.empty(); }
  // A tokenizer's normalizer on a section; the view it returns outlives the sections.
  using Normalize = std::function<std::string_view(std::string_view)>;
  // Appends the sections of text (valid UTF-8), in order, to sections. With `normalize`, each
  // section between the normalized-false tokens is normalized before the normalized-true tokens
  // are found in it, as tokenizers does.
  void split(std::string_view text, std::vector<TextSection>& sections, const Normalize* normalize = nullptr) const;

 private:
  class Matcher {
   public:
    void add(const AddedToken& token);
    void finish();  // sorts the candidates, longest first
    bool empty() const { return tokens_.empty(); }
    void split(std::string_view text, std::vector<TextSection>& sections) const;

   private:
    std::vector<AddedToken> tokens_;
    // Indices into tokens_ by their first byte, longest content first.
    std::array<std::vector<std::size_t>, 256> by_first_byte_;
  };
  Matcher non_normalized_, normalized_;
};

}  // namespace gradaccum::data
